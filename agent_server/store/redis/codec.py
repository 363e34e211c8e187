"""Records to and from the scripts' arguments and replies, and the store's URL as messages may
show it (never its password)."""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

from agent_server.model import jsoncodec
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.store import sentinel
from agent_server.store.base import ListCursor, StoreObserver
from agent_server.store.redis.scripts import FIELDS, Moved, Row

logger = logging.getLogger("agent_server.store")


def describe_url(url: str) -> str:
    """Where the store is, for messages and logs: scheme, host, port and db, never the
    user name or password the URL may carry; for Sentinel, the sentinels and the service."""
    if sentinel.is_sentinel_url(url):
        return sentinel.describe(url)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    db = parts.path.lstrip("/") or "0"
    return f"{parts.scheme}://{host}:{port}/{db}"


def scrub(url: str, text: str) -> str:
    """Never let a password in the URL reach a message."""
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:  # brackets holding no address: the URL is refused as malformed
        password = None
    if password:
        text = text.replace(password, "***")
        text = text.replace(urllib.parse.unquote(password), "***")
    return text


def dumps(value: Any) -> bytes:
    return jsoncodec.dumps(value)


def loads(text: str) -> Any:
    """The standard library's parser, as for requests: it keeps integers past 64 bits exact
    (orjson would turn them into floats)."""
    return jsoncodec.loads(text.encode())


def _input_request(text: str | None) -> dict[str, Any] | None:
    """The record's `input_request` (JSON text; absent from records written before it)."""
    if not text:
        return None
    value = loads(text)
    return value if isinstance(value, dict) else None


def _number(text: str) -> float | None:
    return float(text) if text else None


def cursor(after: ListCursor | None) -> tuple[str, str]:
    """A list cursor as the list script takes it: the score (as the cursor spells it: the
    script compares it to the index's text for ties) and id ('' '' from the newest)."""
    if after is None:
        return "", ""
    return after.score, after.execution_id


class RowCodec:
    """Records as the scripts return and take them; a read that moved a record to lost is
    counted where it is decoded, once."""

    __slots__ = ("observer",)

    def __init__(self, observer: StoreObserver | None) -> None:
        self.observer = observer

    def restore(self, row: list[Any]) -> Execution:
        """The record as a script returned it; a move to lost it made is counted here."""
        status_reason, result, error = row[Row.STATUS_REASON], row[Row.RESULT], row[Row.ERROR]
        execution = Execution.restore(
            row[Row.EXECUTION_ID],
            row[Row.REASONER],
            row[Row.SESSION_ID] or None,
            replica=row[Row.REPLICA],
            attempt=int(row[Row.ATTEMPT]),
            status=ExecutionStatus(row[Row.STATUS]),
            created_at=float(row[Row.CREATED_AT]),
            status_reason=CancelReason(status_reason) if status_reason else None,
            result=loads(result) if result else None,
            error=loads(error) if error else None,
            finished_at=_number(row[Row.FINISHED_AT]),
            duration_seconds=_number(row[Row.DURATION_SECONDS]),
            abandoned=row[Row.ABANDONED] == "1",
            input_request=_input_request(row[Row.INPUT_REQUEST]),
            scheduled_at=_number(row[Row.SCHEDULED_AT]),
        )
        moved = Moved(int(row[Row.MOVED]))
        if moved is Moved.LOST and self.observer is not None:
            self.observer.execution_lost(execution)
        elif moved is Moved.QUEUED:
            logger.warning(
                "execution %s (%s): its owner stopped renewing its liveness; attempt %d queued",
                execution.execution_id,
                execution.reasoner,
                execution.attempt,
            )
        return execution

    def from_notice(self, row: list[Any]) -> Execution | None:
        """A record from an end notice; None (it is read instead) if it does not parse."""
        try:
            return self.restore([*row, 0])
        except (ValueError, TypeError, KeyError) as exc:
            logger.warning("an end notice's record did not parse (%s): it is read instead", exc)
            return None

    @staticmethod
    def new_record(execution: Execution) -> list[str | bytes]:
        """The hash values in FIELDS order, for a record being created: nothing ended yet,
        so no result, error or end to encode (on the path of every start)."""
        values: dict[str, str | bytes] = {
            "execution_id": execution.execution_id,
            "reasoner": execution.reasoner,
            "session_id": execution.session_id or "",
            "status": execution.status.value,
            "status_reason": "",
            "result": b"null",
            "error": b"null",
            "created_at": repr(execution.created_at),
            "finished_at": "",
            "duration_seconds": "",
            "replica": execution.replica,
            "attempt": str(execution.attempt),
            "input_request": b"null",
            "scheduled_at": "" if execution.scheduled_at is None else repr(execution.scheduled_at),
            "abandoned": "0",
        }
        return [values[name] for name in FIELDS]

    @staticmethod
    def end_args(execution: Execution) -> list[str | bytes]:
        """An end's arguments of the `end` script: who writes it, then what it records."""
        duration = execution.duration_seconds
        return [
            execution.execution_id,
            execution.replica,
            str(execution.attempt),
            execution.status.value,
            execution.status_reason.value if execution.status_reason else "",
            dumps(execution.result),
            b"null" if execution.error is None else dumps(execution.error),
            "" if execution.finished_at is None else repr(execution.finished_at),
            "" if duration is None else repr(duration),
            "1" if execution.abandoned else "0",
        ]
