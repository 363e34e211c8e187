"""The execution record's fields, declared once: every field a store keeps.

What every route returns for an execution, what a shared store keeps of it, and what the
client reads back are made from this one list: `Execution`'s slots, `__init__`, `restore`
and `to_json` (generated from it, as `dataclasses` generates `__init__`), the OpenAPI schema
(`schema()`), the Redis hash, its encoding and the positions its scripts return
(`store/redis/codec.py`, `scripts.py`, `codes.lua`), what the end script reads, writes and
clears (`ending.lua`) and what goes with the requests for input (`record.lua`), and the
client's model (`agent_server.client`, checked against it). A new
field is one row here. It imports only the state machine, so the client can read it.
"""

from __future__ import annotations

import enum
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any

from agent_server.model.status import CancelReason, ExecutionStatus


class Shown(enum.Enum):
    """How a field's value is written in the execution's JSON."""

    #: As it is.
    VALUE = "value"
    #: A Unix time, as RFC 3339 in UTC with microseconds (`...T12:00:00.000000Z`).
    TIME = "time"
    #: The same, or null.
    TIME_OR_NULL = "time_or_null"
    #: The replica that runs it: "" while it is queued (nobody runs it; the replica that
    #: handed it off keeps its id, which fences its late end, but no client is told so).
    OWNER = "owner"
    #: Not shown: kept by the store only.
    HIDDEN = "hidden"


class Kind(enum.Enum):
    """What a field's value is in Python; a store writes each kind one way
    (store/redis/codec.py: the hash's text)."""

    TEXT = "text"
    #: Text or None ('' in the hash).
    TEXT_OR_NONE = "text_or_none"
    STATUS = "status"
    #: A CancelReason or None.
    REASON = "reason"
    #: Any JSON value (JSON text in the hash; None is `null`).
    JSON = "json"
    #: A JSON object or None (anything else read back is None).
    OBJECT_OR_NONE = "object_or_none"
    #: A Unix time (float).
    TIME = "time"
    #: A number or None ('' in the hash).
    NUMBER_OR_NONE = "number_or_none"
    #: A non-negative integer.
    COUNT = "count"
    #: True or False ('1' or '0').
    FLAG = "flag"


class Kept(enum.Enum):
    """Where a store keeps a field."""

    #: In the record every script returns, in this declaration's order (Row, Lua's `F`).
    ROW = "row"
    #: In the record's hash only: written when the record is created (`Written`) or by the
    #: scripts named in its comment, and read by name where it is needed.
    HASH = "hash"


class Written(enum.Enum):
    """When a store writes a hash-only field that `Execution` holds."""

    #: By the scripts alone (from their own arguments).
    BY_SCRIPTS = "by_scripts"
    #: With the record, when set (not None).
    WITH_RECORD = "with_record"
    #: With the record, for a resumable execution or one with a body (every start with
    #: input): judge.lua and owned.lua read `max_attempts` (1: not resumable).
    WITH_BODY = "with_body"


class AtEnd(enum.Enum):
    """What an attempt's end (end.lua) does to the field."""

    #: Kept as it is.
    KEPT = "kept"
    #: Written from the end's arguments, in this declaration's order.
    WRITTEN = "written"
    #: Cleared to its empty value (`Field.empty`).
    CLEARED = "cleared"


#: `Field.default` of a field every record is made with (no default).
REQUIRED: Any = object()


@dataclass(frozen=True, kw_only=True)
class Field:
    """One field a store keeps: its name (in JSON and in the Redis hash), its kind, where
    it is kept, and how it is shown."""

    name: str
    kind: Kind
    kept: Kept = Kept.ROW
    shown: Shown = Shown.HIDDEN
    schema: dict[str, Any] = field(default_factory=dict)
    #: The `Execution` attribute read for it (a property, when `slot` differs); None for a
    #: field only the store keeps and reads.
    attr: str | None = ""
    #: The slot `__init__` and `restore` write; the attribute's by default.
    slot: str = ""
    #: Its value in a new record, and in a copy read from a store where the row lacks it.
    default: Any = None
    #: A hash-only field's writer (the scripts', or the record's create).
    written: Written = Written.BY_SCRIPTS
    at_end: AtEnd = AtEnd.KEPT
    #: Its value in the hash when cleared (end.lua).
    empty: str = ""
    #: Part of its requests for input, dropped with them when it ends (records.lua).
    requests: bool = False
    #: A name pattern, one field per request for input (`answer:{n}` is `answer:1`, ...);
    #: part of its requests.
    per_request: bool = False

    def __post_init__(self) -> None:
        if self.per_request:
            object.__setattr__(self, "requests", True)
        if self.attr == "":
            object.__setattr__(self, "attr", self.name)
        if self.slot == "" and self.attr is not None:
            object.__setattr__(self, "slot", self.attr)

    @property
    def hash_name(self) -> str:
        """Its name in the hash; a per-request field's prefix (`answer:`)."""
        return f"{self.name}:" if self.per_request else self.name


_NULLABLE_STRING: dict[str, Any] = {"type": ["string", "null"]}
_TIME: dict[str, Any] = {"type": "string", "format": "date-time"}

#: What an execution waiting for input asks (`ctx.ask`), in the Execution schema.
INPUT_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["request_id", "prompt", "schema", "asked_at", "expires_at"],
    "properties": {
        "request_id": {"type": "integer", "minimum": 1, "description": "1, 2, ... per execution"},
        "prompt": {"description": "the reasoner's prompt (JSON)"},
        "schema": {
            "type": ["object", "null"],
            "description": "the JSON schema the answer is validated against; null for any JSON",
        },
        "asked_at": _TIME,
        "expires_at": {"oneOf": [{"type": "null"}, _TIME]},
    },
}

_HASH, _VALUE = Kept.HASH, Shown.VALUE
_WRITTEN, _CLEARED = AtEnd.WRITTEN, AtEnd.CLEARED

#: Every field a store keeps: first the record (in the order of its JSON and of every
#: script's row), then the hash-only fields.
STORED: tuple[Field, ...] = (
    Field(name="execution_id", kind=Kind.TEXT, shown=_VALUE, schema={"type": "string"},
          default=REQUIRED),
    Field(name="reasoner", kind=Kind.TEXT, shown=_VALUE, schema={"type": "string"},
          default=REQUIRED),
    Field(name="session_id", kind=Kind.TEXT_OR_NONE, shown=_VALUE, schema=_NULLABLE_STRING,
          default=REQUIRED),
    Field(name="status", kind=Kind.STATUS, shown=_VALUE, at_end=_WRITTEN, default=REQUIRED,
          schema={"enum": [status.value for status in ExecutionStatus]}),
    Field(name="status_reason", kind=Kind.REASON, shown=_VALUE, at_end=_WRITTEN,
          schema={"enum": [*(reason.value for reason in CancelReason), None]}),
    Field(name="result", kind=Kind.JSON, shown=_VALUE, at_end=_WRITTEN, schema={}),
    Field(name="error", kind=Kind.JSON, shown=_VALUE, at_end=_WRITTEN, schema={"oneOf": [
        {"type": "null"},
        {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    ]}),
    Field(name="created_at", kind=Kind.TIME, shown=Shown.TIME, schema=_TIME, default=REQUIRED),
    Field(name="finished_at", kind=Kind.NUMBER_OR_NONE, shown=Shown.TIME_OR_NULL,
          at_end=_WRITTEN, schema={"oneOf": [{"type": "null"}, _TIME]}),
    #: Read through the `duration_seconds` property (clock readings while it runs here).
    Field(name="duration_seconds", kind=Kind.NUMBER_OR_NONE, shown=_VALUE, slot="_duration",
          at_end=_WRITTEN, schema={"type": ["number", "null"]}),
    Field(name="replica", kind=Kind.TEXT, shown=Shown.OWNER, default=REQUIRED, schema={
        "type": "string", "description": "the replica that runs it (or ran it); '' if queued",
    }),
    Field(name="attempt", kind=Kind.COUNT, shown=_VALUE, default=REQUIRED,
          schema={"type": "integer", "minimum": 1}),
    #: The pending request while `input_required`, else null (docs/input.md).
    Field(name="input_request", kind=Kind.OBJECT_OR_NONE, shown=_VALUE, at_end=_CLEARED,
          empty="null", schema={"oneOf": [{"type": "null"}, INPUT_REQUEST_SCHEMA]}),
    #: When it was due to start (a delayed start, a retry after its backoff, a schedule's
    #: fire time), kept after it starts; null when it was due at once.
    Field(name="scheduled_at", kind=Kind.NUMBER_OR_NONE, shown=Shown.TIME_OR_NULL,
          schema={"oneOf": [{"type": "null"}, _TIME]}),
    #: Ended by the drain without settling (the reasoner ignored its cancellation).
    Field(name="abandoned", kind=Kind.FLAG, at_end=_WRITTEN, default=False,
          schema={"type": "boolean"}),
    #: Who started it (the principal's identity) and whose it is (its tenant): None on a
    #: server without authentication. Every name it was started with (session, idempotency
    #: key, concurrency key value) is its tenant's (names.py `scoped`); docs/security.md.
    Field(name="owner", kind=Kind.TEXT_OR_NONE, shown=_VALUE, schema=_NULLABLE_STRING),
    Field(name="tenant", kind=Kind.TEXT_OR_NONE, shown=_VALUE, schema=_NULLABLE_STRING),
    #: The schedule whose firing started it (docs/schedules.md), else None.
    Field(name="schedule_id", kind=Kind.TEXT_OR_NONE, shown=_VALUE, schema=_NULLABLE_STRING),
    #: The version of the code that ran its latest attempt (claim.lua, the start), None
    #: while unversioned or before a first run (docs/durable.md, "Versions").
    Field(name="version", kind=Kind.TEXT_OR_NONE, shown=_VALUE, schema=_NULLABLE_STRING),
    # -- hash-only ------------------------------------------------------------------------
    #: The request body (a later attempt, or a first run elsewhere, binds its arguments
    #: again).
    Field(name="body", kind=Kind.JSON, kept=_HASH, written=Written.WITH_BODY),
    #: How many attempts an owner's death may cost (1: not resumable).
    Field(name="max_attempts", kind=Kind.COUNT, kept=_HASH, written=Written.WITH_BODY,
          default=1),
    #: Its last checkpoint (JSON text), by checkpoint.lua.
    Field(name="checkpoint", kind=Kind.TEXT_OR_NONE, kept=_HASH),
    #: The requests asked by its last checkpoint: a later attempt numbers on from it.
    Field(name="checkpoint_asks", kind=Kind.COUNT, kept=_HASH, default=0),
    #: The version of the code that wrote its last checkpoint (checkpoint.lua).
    Field(name="checkpoint_version", kind=Kind.TEXT_OR_NONE, kept=_HASH),
    #: A checkpoint no replica could read, set aside by a restart (claim.lua), kept to see.
    Field(name="checkpoint_aside", kind=Kind.TEXT, kept=_HASH, attr=None),
    #: Where its webhook deliveries go: never shown (a URL may carry a receiver's token).
    Field(name="webhook", kind=Kind.TEXT_OR_NONE, kept=_HASH, attr="webhook_url",
          written=Written.WITH_RECORD),
    #: The `traceparent` of the request that started it: every attempt joins that trace.
    Field(name="trace", kind=Kind.TEXT_OR_NONE, kept=_HASH, written=Written.WITH_RECORD),
    #: Its concurrency limit's key and how many of that key run at once (enqueue.lua).
    Field(name="ckey", kind=Kind.TEXT_OR_NONE, kept=_HASH, attr="concurrency_key"),
    Field(name="climit", kind=Kind.COUNT, kept=_HASH, attr="concurrency_limit", default=0),
    #: Its session's turn (SESSION_GATE .. sid) when its start waits for it (enqueue.lua).
    Field(name="skey", kind=Kind.TEXT, kept=_HASH, attr=None),
    #: The token of the take that holds it: its claim's (claim.lua) or its create's (the
    #: Redis store's create writes it); unclaim.lua and owned.lua read it.
    Field(name="claim", kind=Kind.TEXT, kept=_HASH, attr=None),
    #: '1' from a claim (claim.lua) until its taker says the body begins (begin.lua): a
    #: dead owner's take still marked never began, and goes back for the same attempt.
    Field(name="unbegun", kind=Kind.TEXT, kept=_HASH, attr=None),
    #: Attempts queued after an owner's death (judge.lua), against `max_attempts`.
    Field(name="retries", kind=Kind.COUNT, kept=_HASH, attr=None, default=0),
    #: The pending request's id while `input_required` (ask.lua), '' for none.
    Field(name="asking", kind=Kind.TEXT, kept=_HASH, attr=None, at_end=_CLEARED),
    #: "{owner}|{attempt}" of the attempt that parked it: its events still owed are written.
    Field(name="parked_by", kind=Kind.TEXT, kept=_HASH, attr=None),
    #: Its history (status.py KEPT_MOVES, `kept_move`), JSON text: every move but its
    #: creation and its end (moves.lua `kept_move`); read apart (`GET .../history`).
    Field(name="moves", kind=Kind.JSON, kept=_HASH, attr=None),
    #: How many `moves` holds (Redis appends to its text, trimming at twice KEPT_MOVES).
    Field(name="moves_n", kind=Kind.COUNT, kept=_HASH, attr=None, default=0),
    #: The requests for input it keeps until it ends (records.lua drops them): the highest
    #: id asked, the kept answers' bytes and the lowest id an answer may be kept for...
    Field(name="asked_top", kind=Kind.COUNT, kept=_HASH, attr=None, requests=True),
    Field(name="answer_bytes", kind=Kind.COUNT, kept=_HASH, attr=None, requests=True),
    Field(name="answers_from", kind=Kind.COUNT, kept=_HASH, attr=None, requests=True),
    #: ...and per request: its answer (JSON), that it expired, its identity and label.
    Field(name="answer", kind=Kind.JSON, kept=_HASH, attr=None, per_request=True),
    Field(name="expired", kind=Kind.FLAG, kept=_HASH, attr=None, per_request=True),
    Field(name="ident", kind=Kind.TEXT, kept=_HASH, attr=None, per_request=True),
    Field(name="label", kind=Kind.TEXT, kept=_HASH, attr=None, per_request=True),
)  # fmt: skip

#: The record: what every script returns, in order.
FIELDS: tuple[Field, ...] = tuple(f for f in STORED if f.kept is Kept.ROW)
#: The hash-only fields.
HASH_FIELDS: tuple[Field, ...] = tuple(f for f in STORED if f.kept is Kept.HASH)
#: The fields of the execution's JSON, in order.
JSON_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.shown is not Shown.HIDDEN)
#: The fields `Execution` holds (an attribute each).
HELD: tuple[Field, ...] = tuple(f for f in STORED if f.attr is not None)
#: An end's fields: written from its arguments (in order), and cleared.
END_WRITES: tuple[Field, ...] = tuple(f for f in STORED if f.at_end is AtEnd.WRITTEN)
END_CLEARS: tuple[Field, ...] = tuple(f for f in STORED if f.at_end is AtEnd.CLEARED)
#: What a record drops with its requests for input (records.lua).
PER_REQUEST: tuple[Field, ...] = tuple(f for f in STORED if f.per_request)
REQUESTS_KEPT: tuple[Field, ...] = tuple(f for f in STORED if f.requests and not f.per_request)
#: Every stored field by its name.
BY_NAME: dict[str, Field] = {f.name: f for f in STORED}
if len(BY_NAME) != len(STORED):
    raise RuntimeError("a field is declared twice in agent_server/model/record.py")


def schema() -> dict[str, Any]:
    """The execution's JSON schema (OpenAPI's `Execution`)."""
    shown = [f for f in FIELDS if f.shown is not Shown.HIDDEN]
    return {
        "type": "object",
        "required": [f.name for f in shown],
        "properties": {f.name: f.schema for f in shown},
    }


def isoformat(timestamp: float) -> str:
    """A TIME field as shown: `datetime.fromtimestamp(timestamp, UTC).strftime(
    "%Y-%m-%dT%H:%M:%S.%fZ")`, the same characters (microseconds rounded half to even),
    cheaper: every response that carries an execution formats two of these, mostly within
    the same few seconds (bench/RESULTS.md)."""
    fraction, whole = math.modf(timestamp)
    micros = round(fraction * 1e6)
    if micros >= 1_000_000:
        whole += 1
        micros -= 1_000_000
    return "%s.%06dZ" % (_whole_second(int(whole)), micros)  # noqa: UP031 - faster than f"{}"


@functools.lru_cache(maxsize=64)
def _whole_second(seconds: int) -> str:
    return "%04d-%02d-%02dT%02d:%02d:%02d" % time.gmtime(seconds)[:6]  # noqa: UP031


def make_function(source: str, namespace: dict[str, Any], name: str) -> Any:
    """Compile `source` (made from this declaration) and return the function `name`:
    straight-line code, as fast as one written out."""
    exec(compile(source, f"<agent_server.model.record {name}>", "exec"), namespace)
    return namespace[name]


_EXPRESSIONS = {
    Shown.VALUE: "self.{name}",
    Shown.TIME: "isoformat(self.{name})",
    Shown.TIME_OR_NULL: "None if self.{name} is None else isoformat(self.{name})",
    Shown.OWNER: "'' if self.status is QUEUED else self.{name}",
}


def json_maker() -> Any:
    """`to_json` for a class with an attribute per field: one dict display, made from
    FIELDS once at import (a response builds one per execution)."""
    items = ",\n        ".join(
        f"{f.name!r}: {_EXPRESSIONS[f.shown].format(name=f.attr)}"
        for f in FIELDS
        if f.shown is not Shown.HIDDEN
    )
    source = f"def to_json(self):\n    return {{\n        {items},\n    }}\n"
    namespace: dict[str, Any] = {"isoformat": isoformat, "QUEUED": ExecutionStatus.QUEUED}
    return make_function(source, namespace, "to_json")


def assigner(
    name: str, params: str, values: dict[str, str], namespace: dict[str, Any], new: bool = False
) -> Any:
    """A function `name(params)` that sets each held field's slot: to the expression
    `values` gives for it, else to its declared default; then each other name in `values`
    (the live attempt's slots). What `__init__` and `restore` are made of. `new`: its first
    parameter is the class, and it returns the object it makes (`cls.__new__(cls)`)."""
    lines = ["    self = cls.__new__(cls)"] if new else []
    for f in HELD:
        if f.slot in values:
            lines.append(f"    self.{f.slot} = {values[f.slot]}")
        elif f.default is REQUIRED:
            raise RuntimeError(f"{name} must set {f.name}: it has no default")
        else:
            lines.append(f"    self.{f.slot} = {f.default!r}")
    held = {f.slot for f in HELD}
    lines.extend(f"    self.{slot} = {value}" for slot, value in values.items() if slot not in held)
    if new:
        lines.append("    return self")
    source = f"def {name}({params}):\n" + "\n".join(lines) + "\n"
    return make_function(source, namespace, name)
