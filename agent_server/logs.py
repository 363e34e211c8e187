"""Logging set-up: human text or one JSON object per line for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; a shutdown report is embedded as structured data."""

    def format(self, record: logging.LogRecord) -> str:
        report = getattr(record, "shutdown_report", None)
        message = "shutdown report" if report is not None else record.getMessage()
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        if report is not None:
            payload["report"] = report
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def format_line(log_format: str, level: str, name: str, message: str) -> str:
    """A log line built without the logging machinery (for the watchdog thread)."""
    record = logging.LogRecord(name, getattr(logging, level.upper()), "", 0, message, None, None)
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    return formatter.format(record)


def configure_logging(level: str, log_format: str) -> None:
    """Route our loggers and uvicorn's through one stderr handler in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
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
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logger.addHandler(handler)
    logger.setLevel(level.upper())
