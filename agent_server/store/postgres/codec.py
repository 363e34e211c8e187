"""Records to and from rows: the document every row carries, derived from the record's one
declaration (agent_server/model/record.py) as the Redis codec derives its hash, and the
store's URL as messages may show it (never its password).

A row is `doc` (the JSON text of every field `Execution` holds, by its declared name; text,
not JSONB, so a result keeps its key order and integers past 64 bits exactly) plus the
columns the store's statements read: indexed or fenced on (status, owner replica, attempt,
session, tenant, ...) and the store-only fields (`Field.attr` None: the take token, the
retries, the requests for input). The columns are written from the same object as the
document, in the same statement.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any

from agent_server.model import jsoncodec, record
from agent_server.model.asks import Entry, Ledger
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.record import Kind


def is_postgres_url(url: str) -> bool:
    """`postgresql://…` or `postgres://…` (the two spellings libpq takes)."""
    return url.startswith(("postgresql://", "postgres://"))


def describe_url(url: str) -> str:
    """Where the store is, for messages and logs: scheme, hosts and database, never the
    user name or password (nor any other parameter: a `password=` may be among them)."""
    parts = urllib.parse.urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2] or "localhost"
    database = parts.path.lstrip("/") or "(default)"
    return f"{parts.scheme}://{hosts}/{database}"


def scrub(url: str, text: str) -> str:
    """Never let a password in the URL reach a message."""
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:
        password = None
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    secrets = [password, *query.get("password", [])]
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***").replace(urllib.parse.unquote(secret), "***")
    return text


def dumps(value: Any) -> str:
    return jsoncodec.dumps(value).decode()


def loads(text: str) -> Any:
    """The standard library's parser (integers past 64 bits stay exact)."""
    return jsoncodec.loads(text.encode())


#: How each kind is written in the document (`{v}`: the value) and read back (`{t}`).
_ENCODE = {
    Kind.TEXT: "{v}",
    Kind.TEXT_OR_NONE: "{v}",
    Kind.STATUS: "{v}.value",
    Kind.REASON: "None if {v} is None else {v}.value",
    Kind.JSON: "{v}",
    Kind.OBJECT_OR_NONE: "{v}",
    Kind.TIME: "{v}",
    Kind.NUMBER_OR_NONE: "{v}",
    Kind.COUNT: "{v}",
    Kind.FLAG: "bool({v})",
}
_DECODE = {
    Kind.TEXT: "{t} or ''",
    Kind.TEXT_OR_NONE: "{t}",
    Kind.STATUS: "STATUS({t})",
    Kind.REASON: "None if {t} is None else REASON({t})",
    Kind.JSON: "{t}",
    Kind.OBJECT_OR_NONE: "{t} if isinstance({t}, dict) else None",
    Kind.TIME: "float({t})",
    Kind.NUMBER_OR_NONE: "None if {t} is None else float({t})",
    Kind.COUNT: "int({t} or 0)",
    Kind.FLAG: "bool({t})",
}


def _functions() -> dict[str, Any]:
    """`to_doc(e)` (every held field by name) and `from_doc(d)` (the record, then each
    held store-side field), made from the declaration once at import."""
    items = ", ".join(f"{f.name!r}: {_ENCODE[f.kind].format(v=f'e.{f.attr}')}" for f in record.HELD)
    fields = ", ".join(
        f"{f.name}={_DECODE[f.kind].format(t=f'd.get({f.name!r})')}" for f in record.FIELDS
    )
    extra = "".join(
        f"    if {f.name!r} in d:\n"
        f"        e.{f.slot} = {_DECODE[f.kind].format(t=f'd[{f.name!r}]')}\n"
        for f in record.HASH_FIELDS
        if f.attr is not None
    )
    source = (
        f"def to_doc(e):\n    return {{{items}}}\n"
        f"def from_doc(d):\n    e = restore({fields})\n{extra}    return e\n"
    )
    namespace: dict[str, Any] = {
        "STATUS": ExecutionStatus,
        "REASON": CancelReason,
        "restore": Execution.restore,
    }
    exec(compile(source, "<agent_server.store.postgres.codec>", "exec"), namespace)
    return namespace


_MADE = _functions()
_to_doc: Callable[[Execution], dict[str, Any]] = _MADE["to_doc"]
_from_doc: Callable[[dict[str, Any]], Execution] = _MADE["from_doc"]


def encode(execution: Execution) -> str:
    """The row's document: every field `Execution` holds, as JSON text."""
    return dumps(_to_doc(execution))


def decode(doc: str) -> Execution:
    """The execution a row's document holds (a copy, as another replica reads it)."""
    execution = _from_doc(loads(doc))
    if execution.max_attempts > 1:  # every record keeps its body: that says nothing
        execution.resumable = True
    return execution


def result_bytes(execution: Execution) -> int:
    """Bytes of its result and error as JSON (what `max_bytes` of a page counts)."""
    size = len(jsoncodec.dumps(execution.result))
    if execution.error is not None:
        size += len(jsoncodec.dumps(execution.error))
    return size


def kept_bytes(execution: Execution) -> int:
    """Bytes of what a finished record keeps of its own: its input, result and error as
    JSON (what `--max-retained-bytes` counts)."""
    size = result_bytes(execution)
    if execution.body is not None:
        size += len(jsoncodec.dumps(execution.body))
    return size


def encode_with(execution: Execution, **changes: Any) -> str:
    """The document of `execution` with some fields as a statement moves them (by name)."""
    doc = _to_doc(execution)
    doc.update(changes)
    return dumps(doc)


def ledger_dumps(ledger: Ledger) -> str:
    """A record's requests for input (asks.Ledger) as JSON text."""
    return dumps(
        {
            "top": ledger.top,
            "bytes": ledger.answer_bytes,
            "from": ledger.kept_from,
            "entries": [
                [n, e.identity, e.label, e.answered, e.value, e.size, e.expired]
                for n, e in ledger.entries.items()
            ],
        }
    )


def ledger_loads(text: str | None) -> Ledger:
    """The requests as `ledger_dumps` wrote them (an empty ledger for none)."""
    ledger = Ledger()
    if not text:
        return ledger
    data = loads(text)
    ledger.top, ledger.answer_bytes, ledger.kept_from = data["top"], data["bytes"], data["from"]
    for n, identity, label, answered, value, size, expired in data["entries"]:
        ledger.entries[int(n)] = Entry(identity, label, answered, value, size, expired)
    return ledger
