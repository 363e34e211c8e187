"""Records to and from the scripts' arguments and replies, and the store's URL as messages may
show it (never its password)."""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from agent_server.model import jsoncodec, record
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.record import Kind
from agent_server.store.base import ListCursor, StoreObserver
from agent_server.store.redis import sentinel
from agent_server.store.redis.scripts import Moved, Row

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


def _object_or_none(text: str | None) -> dict[str, Any] | None:
    """A JSON object, or None (`input_request`: absent from records written before it)."""
    if not text:
        return None
    value = loads(text)
    return value if isinstance(value, dict) else None


#: How each kind of field is written in the hash (`{v}`: the value) and read back (`{t}`:
#: the text; `{default}`: the field's default).
_ENCODE = {
    Kind.TEXT: "{v}",
    Kind.TEXT_OR_NONE: '{v} or ""',
    Kind.STATUS: "{v}.value",
    Kind.REASON: '"" if {v} is None else {v}.value',
    Kind.JSON: 'b"null" if {v} is None else dumps({v})',
    Kind.OBJECT_OR_NONE: 'b"null" if {v} is None else dumps({v})',
    Kind.TIME: "repr({v})",
    Kind.NUMBER_OR_NONE: '"" if {v} is None else repr({v})',
    Kind.COUNT: "str({v})",
    Kind.FLAG: '"1" if {v} else "0"',
}
_DECODE = {
    Kind.TEXT: "{t}",
    Kind.TEXT_OR_NONE: "{t} or None",
    Kind.STATUS: "STATUS({t})",
    Kind.REASON: "REASON({t}) if {t} else None",
    Kind.JSON: "loads({t}) if {t} else None",
    Kind.OBJECT_OR_NONE: "object_or_none({t})",
    Kind.TIME: "float({t})",
    Kind.NUMBER_OR_NONE: "float({t}) if {t} else None",
    Kind.COUNT: "int({t}) if {t} else {default!r}",
    Kind.FLAG: '{t} == "1"',
}
_NAMESPACE: dict[str, Any] = {
    "dumps": jsoncodec.dumps,
    "loads": loads,
    "object_or_none": _object_or_none,
    "STATUS": ExecutionStatus,
    "REASON": CancelReason,
    "restore": Execution.restore,
}


def _encode(f: record.Field) -> str:
    return _ENCODE[f.kind].format(v=f"e.{f.attr}")


def _decode(f: record.Field, text: str) -> str:
    if f.kind is Kind.COUNT and f.default is record.REQUIRED:
        return f"int({text})"
    return _DECODE[f.kind].format(t=text, default=f.default)


def _codec_functions() -> dict[str, Any]:
    """The record's encoding, made from its declaration once at import: the values a new
    record is created with (the row's, in order, then the hash-only fields written with
    it, as pairs), an end's arguments, the record from a row, and each held field's reader."""
    row = ", ".join(_encode(f) for f in record.FIELDS)
    extra = []
    with_body = [f for f in record.HASH_FIELDS if f.written is record.Written.WITH_BODY]
    if with_body:
        pairs = ", ".join(f"{f.name!r}, {_encode(f)}" for f in with_body)
        extra.append(f"    if e.resumable or e.body is not None:\n        values.extend(({pairs}))")
    for f in record.HASH_FIELDS:
        if f.written is record.Written.WITH_RECORD:
            extra.append(
                f"    if e.{f.attr} is not None:\n        values.extend(({f.name!r}, {_encode(f)}))"
            )
    ends = ", ".join(_encode(f) for f in record.END_WRITES)
    fields = ", ".join(f"{f.name}={_decode(f, f'row[{i}]')}" for i, f in enumerate(record.FIELDS))
    source = (
        f"def new_record(e):\n    values = [{row}]\n"
        + "".join(line + "\n" for line in extra)
        + "    return values\n"
        + f"def end_args(e):\n    return [e.execution_id, e.replica, str(e.attempt), {ends}]\n"
        + f"def from_row(row):\n    return restore({fields})\n"
    )
    for f in record.HASH_FIELDS:
        if f.attr is not None:
            source += f"def read_{f.name}(text):\n    return {_decode(f, 'text')}\n"
    namespace = dict(_NAMESPACE)
    exec(compile(source, "<agent_server.store.redis.codec>", "exec"), namespace)
    return namespace


_MADE = _codec_functions()
#: The hash's values for a record being created (on the path of every start).
new_record: Callable[[Execution], list[str | bytes]] = _MADE["new_record"]
#: An end's arguments of the `end` script: who writes it, then what it records
#: (record.END_WRITES, in order).
end_args: Callable[[Execution], list[str | bytes]] = _MADE["end_args"]
#: The record as a script returned it (record.FIELDS, in order).
from_row: Callable[[list[Any]], Execution] = _MADE["from_row"]
#: Each hash-only field `Execution` holds, read from the hash's text.
READERS: dict[str, Callable[[Any], Any]] = {
    f.name: _MADE[f"read_{f.name}"] for f in record.HASH_FIELDS if f.attr is not None
}


def read_into(execution: Execution, values: dict[str, Any]) -> None:
    """Set the hash-only fields a script returned (by name) on `execution`."""
    for name, text in values.items():
        setattr(execution, record.BY_NAME[name].slot, READERS[name](text))


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
        execution = from_row(row)
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

    #: The hash's values for a record being created: the row's in FIELDS order, then the
    #: hash-only fields written with it, as pairs (on the path of every start).
    new_record = staticmethod(new_record)
    #: An end's arguments of the `end` script.
    end_args = staticmethod(end_args)
