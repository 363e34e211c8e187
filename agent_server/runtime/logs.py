"""Logging set-up: human text or one JSON object per line for log pipelines; the access log."""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_server.model import redaction
from agent_server.model.execution import Execution, log_fields

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The logger of the access lines (`--access-log`).
ACCESS_LOGGER = "agent_server.access"
#: The keys every JSON line has; a record's `fields` never replace them.
BASE_KEYS = frozenset({"timestamp", "level", "logger", "message"})
#: Loggers of libraries whose lines name the URLs they call (httpx: "HTTP Request: POST
#: <url>"), given the redaction filter themselves, so their lines are redacted under any
#: handler, the application's too.
URL_LOGGERS = ("httpx",)
#: Loggers of libraries that echo what a client sent, and the characters of it they may
#: show (quoted): OpenTelemetry's baggage propagator logs a malformed `baggage` header.
ECHO_LOGGERS = {"opentelemetry.baggage.propagation": 64}


#: What the lines logged in the running task are about. Each task runs in a copy of the
#: context it was made in, so a value set there stays in that task (and the threads it
#: hands a copy of its context). The execution its reasoner runs, set by the registry at
#: the start of the task, so the reasoner's own logging carries it too:
LOG_EXECUTION: ContextVar[Execution | None] = ContextVar("agent_server_log_execution", default=None)
#: The span it runs in (trace id, span id, hex), set by `agent_server.runtime.tracing` when traces
#: are on: a request's server span, an attempt's span.
LOG_SPAN: ContextVar[tuple[str, str] | None] = ContextVar("agent_server_log_span", default=None)
#: Who the request is from (identity, tenant), set by authentication (http/auth.py): never
#: a token or a claim (docs/security.md), and never a metric's label.
LOG_PRINCIPAL: ContextVar[tuple[str, str] | None] = ContextVar(
    "agent_server_log_principal", default=None
)


#: The fields a JSON line about one execution carries (`extra={"fields": ...}` where a line
#: is logged outside the execution's own task); the store's lines use it from execution.py.
execution_fields = log_fields


class JsonFormatter(logging.Formatter):
    """One JSON object per record; a shutdown report is embedded as structured data, and a
    record's `fields` (`extra={"fields": {...}}`) become keys of the object, so a pipeline
    reads the access line's status or the start line's store without parsing a message.
    A line logged inside an execution's task (or a traced request) carries its scope's
    execution and trace fields; a record's own `fields` win over them."""

    def format(self, record: logging.LogRecord) -> str:
        report = getattr(record, "shutdown_report", None)
        message = "shutdown report" if report is not None else record.getMessage()
        payload: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        who = LOG_PRINCIPAL.get()
        if who is not None:
            payload["identity"], payload["tenant"] = who
        execution = LOG_EXECUTION.get()
        if execution is not None:
            payload.update(log_fields(execution))
        span = LOG_SPAN.get()
        if span is not None:
            payload["trace_id"], payload["span_id"] = span
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            payload.update((key, value) for key, value in fields.items() if key not in BASE_KEYS)
        if report is not None:
            payload["report"] = report
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exception"] = record.exc_text
        return json.dumps(payload, default=str)


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, each record's line kept to one line: a message's control characters
    (a CR or LF in a path a client sent, an escape sequence) are escaped, so no text a
    client chose can start a line that reads as the server's. A traceback follows on lines
    of its own, as Python prints it."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return redaction.one_line(super().formatMessage(record))


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of `--log-format`."""
    return JsonFormatter() if log_format == "json" else TextFormatter()


def _handler() -> logging.Handler:
    """The one stderr handler, URLs redacted in every line it writes (redaction.py); the
    loggers of URL_LOGGERS redact their own lines too, whoever handles them, and those of
    ECHO_LOGGERS quote and bound what they echo."""
    handler = logging.StreamHandler(sys.stderr)
    redaction.install(handler, redaction.RedactUrls())
    for name in URL_LOGGERS:
        redaction.install(logging.getLogger(name), redaction.RedactUrls())
    for name, limit in ECHO_LOGGERS.items():
        redaction.install(logging.getLogger(name), redaction.QuoteArgs(limit))
    return handler


def format_line(log_format: str, level: str, name: str, message: str) -> str:
    """A log line built without the logging machinery (for the watchdog thread)."""
    record = logging.LogRecord(name, getattr(logging, level.upper()), "", 0, message, None, None)
    redaction.RedactUrls().filter(record)
    return formatter(log_format).format(record)


def configure_logging(level: str, log_format: str) -> None:
    """Route our loggers and uvicorn's through one stderr handler in the chosen format."""
    handler = _handler()
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


def configure_unless_configured(level: str, log_format: str) -> None:
    """Under plain uvicorn nothing handles our loggers (uvicorn configures only its own), so
    the shutdown report would be lost: give them the one stderr handler `agent-server run`
    would, and leave logging the application configured alone."""
    logger = logging.getLogger("agent_server")
    if logger.hasHandlers():
        return
    handler = _handler()
    handler.setFormatter(formatter(log_format))
    logger.addHandler(handler)
    logger.setLevel(level.upper())


class AccessLog:
    """ASGI middleware: one line per HTTP request once it has been answered, with the method,
    path, status, duration (`duration_ms`) and client, as fields of the JSON line.

    uvicorn's own access line is written when the answer starts and has no duration (an
    event stream's would read zero); this one is written at the end. In text it reads as
    uvicorn's, the duration added.
    """

    def __init__(self, app: ASGIApp, logger: logging.Logger) -> None:
        self.app = app
        self.logger = logger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        answer = StatusSend(send)
        try:
            await self.app(scope, receive, answer)
        finally:
            # No status: the app raised (or was cancelled) first, and the server answers 500.
            self._line(scope, answer.status or 500, time.perf_counter() - started)

    def _line(self, scope: Scope, status: int, seconds: float) -> None:
        client = scope.get("client")
        # Port 0: a proxy's X-Forwarded-For gave the host, and no port is known.
        address = None if client is None else f"{client[0]}:{client[1]}" if client[1] else client[0]
        query = scope.get("query_string", b"").decode("latin-1")
        fields: dict[str, Any] = {
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
            "client": address,
            "http_version": scope.get("http_version", "1.1"),
        }
        if query:
            fields["query"] = query
        # Quoted as uvicorn's own access line quotes it: the path is percent-decoded, and
        # may hold a CR or LF a client sent as %0D%0A.
        target = quote(scope["path"]) + (f"?{query}" if query else "")
        self.logger.info(
            '%s - "%s %s HTTP/%s" %d %.6fs',
            address or "-",
            scope["method"],
            target,
            fields["http_version"],
            status,
            seconds,
            extra={"fields": fields},
        )


class StatusSend:
    """The `send` of one request: notes the status it answers (for `AccessLog`'s line and
    the server span's status, agent_server/runtime/tracing.py)."""

    __slots__ = ("send", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)
