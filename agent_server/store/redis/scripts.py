"""The Lua scripts, one file each under `lua/`, shipped as package data.

Each file opens with its contract (KEYS, ARGV, replies) and names the files it builds on
with `--! include NAME.lua` lines; `load` inlines each included file once, before the first
file that includes it, so a script carries exactly the code it uses. `codes.lua` is made
here from the reply codes below and the statuses of the state machine, so Lua and Python
read the same names; `record.lua` is made from the record's declaration.

Redis runs each script as a function of a library of its own (`library`): what the files
define (constants, tables, the shared functions) is made once, when Redis loads the library,
rather than on every call as an `EVALSHA` would, where it was about a third of a call's cost
(bench/RESULTS.md, "R55"). Each library and function is named by its script and a digest of
its text, so two versions of the server on one Redis each call their own.
"""

from __future__ import annotations

import enum
import hashlib
import re
from importlib import resources

from agent_server.model import record
from agent_server.model.scheduling import session_key
from agent_server.model.status import (
    ACTIVE,
    END_OF,
    KEPT_MOVES,
    OWNED,
    PARKED,
    TABLE,
    ExecutionStatus,
    clears,
    keeps_move,
)
from agent_server.model.versions import Rule
from agent_server.store.values import OUTAGE_LEASES

#: Every script the store calls, by the name it calls it.
NAMES = (
    "create",
    "end",
    "get",
    "list",
    "forget",
    "tick",
    "checkpoint",
    "handoff",
    "claim",
    "begin",
    "emit",
    "cancel_queued",
    "end_release",
    "settle",
    "owned",
    "ask",
    "answer",
    "expire",
    "webhook_claim",
    "webhook_settle",
    "enqueue",
    "unclaim",
    "cancel",
    "marks",
    "schedule_put",
)


class Row(enum.IntEnum):
    """A record as a script returns it, by position (from 0; Lua's `I_STATUS` is one more):
    the record's fields as agent_server/model/record.py declares them, in its order (the hash,
    Lua's `F`), then what a read adds: what it did to the record, whether a list matched it,
    and the list cursor past it. Python and Lua both read a row through these names."""

    EXECUTION_ID = 0
    REASONER = 1
    SESSION_ID = 2
    STATUS = 3
    STATUS_REASON = 4
    RESULT = 5
    ERROR = 6
    CREATED_AT = 7
    FINISHED_AT = 8
    DURATION_SECONDS = 9
    REPLICA = 10
    ATTEMPT = 11
    INPUT_REQUEST = 12
    SCHEDULED_AT = 13
    ABANDONED = 14
    OWNER = 15
    TENANT = 16
    SCHEDULE_ID = 17
    VERSION = 18
    MOVED = 19
    MATCHED = 20
    CURSOR = 21


#: The record's hash fields, in the order every script returns them: the declaration's.
FIELDS = tuple(field.name for field in record.FIELDS)
if tuple(index.name.lower() for index in Row if index < Row.MOVED) != FIELDS:
    raise RuntimeError("Row must name agent_server/model/record.py's fields, in its order")


class Create(enum.IntEnum):
    """The first value of create.lua's reply."""

    CREATED = 1
    RELEASING = 0
    KEY_MISMATCH = -1
    KEY_FORGOTTEN = -2
    VOIDED = -3
    LEASE_LAPSED = -4
    FULL = -5
    BUSY = -6
    EXISTING = 2


class Forget(enum.IntEnum):
    """The first value of forget.lua's reply."""

    UNKNOWN = 0
    ACTIVE = -1
    FORGOTTEN = 1


class Asked(enum.IntEnum):
    """The first value of ask.lua's reply."""

    FENCED = 0
    RECORDED = 1
    ANSWERED = 2
    TIMED_OUT = 3
    PARKED = 4
    AGAIN = 5
    MISMATCH = 6


class Unclaimed(enum.IntEnum):
    """The first value of claim.lua's reply when it took nothing, below any wait in ms."""

    NONE_SCHEDULED = -1
    LEASE_LAPSED = -2


class Moved(enum.IntEnum):
    """Value 15 of a record as `read` (judge.lua) returns it: what this call did to it."""

    NOT = 0
    LOST = 1
    QUEUED = 2


_INCLUDE = re.compile(r"^--! include (\S+)$", re.MULTILINE)
#: A cleared hash field's value: '' but for the JSON ones the codec writes, JSON `null`.
_CLEARED_JSON = frozenset({"input_request"})


def _moves() -> list[str]:
    """codes.lua's part of the state machine, for lua/moves.lua: each transition's name
    (`MOVE_HAND_OFF`); `MOVES(rec, transition, found, target, ...)`, every row of status.py's
    table as code: when the row moves `found` to `target`, one HSET of the status, the hash
    fields the move clears with their cleared values, then the caller's pairs (...), and
    true; false, writing nothing, for a move the table lacks; `CREATES(transition, status)`,
    when `transition` is a creation (no source) that makes `status`, the fields it clears
    (the record is written whole: its values come cleared), else nil; `END_OF[status]`,
    the transition an end to it is; the status a parked record shows (`PARKED_STATUS`);
    which moves join a record's history (`KEEPS_MOVE[target]`) and how many it keeps.
    Code rather than a table: a table of every row, built on each call of every script, was
    most of what a script's opening cost Redis, and the HSET takes the caller's pairs with
    no table built (bench/RESULTS.md, "B38b")."""
    lines = [f"local MOVE_{row.transition.name} = '{row.transition.value}'" for row in TABLE]
    lines.append("local function MOVES(rec, transition, found, target, ...)")
    for row in TABLE:
        if not row.sources:
            continue  # a creation is no move (CREATES)
        sources = " or ".join(f"found == '{status.value}'" for status in sorted(row.sources))
        lines.append(f"  if transition == '{row.transition.value}' then")
        lines.append(f"    if not ({sources}) then return false end")
        for target in sorted(row.targets):
            pairs = "".join(
                f"'{name}', '{'null' if name in _CLEARED_JSON else ''}', "
                for name in clears(row.transition, target)
            )
            lines.append(
                f"    if target == '{target.value}' then"
                f" redis.call('HSET', rec, 'status', target, {pairs}...) return true end"
            )
        lines.append("    return false")
        lines.append("  end")
    lines.append("  return false")
    lines.append("end")
    lines.append("local function CREATES(transition, status)")
    for row in TABLE:
        for target in sorted(row.targets) if not row.sources else ():
            pairs = ", ".join(
                f"'{name}', '{'null' if name in _CLEARED_JSON else ''}'"
                for name in clears(row.transition, target)
            )
            lines.append(
                f"  if transition == '{row.transition.value}' and status == '{target.value}'"
                f" then return {{{pairs}}} end"
            )
    lines.append("  return nil")
    lines.append("end")
    ends = ", ".join(f"{status.value} = '{move.value}'" for status, move in END_OF.items())
    lines.append(f"local END_OF = {{{ends}}}")
    lines.append(f"local PARKED_STATUS = '{ExecutionStatus.INPUT_REQUIRED.value}'  -- {PARKED}")
    keeps = ", ".join(f"{s.value} = true" for s in sorted(ExecutionStatus) if keeps_move(s))
    lines.append(f"local KEEPS_MOVE = {{{keeps}}}")
    lines.append(f"local KEPT_MOVES = {KEPT_MOVES}")
    return lines


def _codes() -> str:
    """codes.lua: each reply code as a Lua local (`CREATE_CREATED` for `Create.CREATED`),
    each status of the state machine (`STATUS_RUNNING`, agent_server/model/status.py), which
    are active (`ACTIVE[status]`: some move leaves them) and which an owner's task runs in
    (`OWNED[status]`: running, or waiting for input), the record's fields (`F`, from
    agent_server/model/record.py) and where each is in a returned record (`I_STATUS`), and
    the version rules a claim answers (`RULE_SAME`, agent_server/model/versions.py)."""
    lines = [
        "-- Made from agent_server/store/redis/scripts.py, status.py, record.py and versions.py."
    ]
    for kind in (Create, Forget, Asked, Unclaimed, Moved):
        for code in kind:
            lines.append(f"local {kind.__name__.upper()}_{code.name} = {int(code)}")
    for status in ExecutionStatus:
        lines.append(f"local STATUS_{status.name} = '{status.value}'")
    for rule in Rule:  # how a claim meets a checkpoint's version (versions.py)
        lines.append(f"local RULE_{rule.name} = '{rule.value}'")
    active = ", ".join(f"{status.value} = true" for status in sorted(ACTIVE))
    lines.append(f"local ACTIVE = {{{active}}}")
    owned = ", ".join(f"{status.value} = true" for status in sorted(OWNED))
    lines.append(f"local OWNED = {{{owned}}}")
    lines.extend(_moves())
    lines.append(f"local SESSION_GATE = '{session_key('')}'")  # a session's turn: .. sid
    lines.append(f"local OUTAGE_LEASES = {OUTAGE_LEASES}")  # store/values.py
    lines.append("local F = {" + ", ".join(f"'{name}'" for name in FIELDS) + "}")
    lines.append("local FINISH_READS = {" + ", ".join(f"'{n}'" for n in _FINISH_READS) + "}")
    for index in Row:
        lines.append(f"local I_{index.name} = {index + 1}")
    return "\n".join(lines) + "\n"


def _record() -> str:
    """record.lua: what agent_server/model/record.py declares that records.lua applies by
    name: what a record drops with its requests for input (`PER_REQUEST` name prefixes,
    `REQUESTS_KEPT`)."""
    return (
        "-- Made from agent_server/model/record.py by agent_server/store/redis/scripts.py.\n"
        f"local PER_REQUEST = {_names(record.PER_REQUEST)}\n"
        f"local REQUESTS_KEPT = {_names(record.REQUESTS_KEPT)}\n"
    )


def _names(fields: tuple[record.Field, ...]) -> str:
    return "{" + ", ".join(f"'{f.hash_name}'" for f in fields) + "}"


#: What end.lua reads of a record before its end, first: the two it compares with a retried
#: end's, and the owner, attempt and session (end.lua reads them by these positions).
_END_CHECKS = ("status", "finished_at", "replica", "attempt", "session_id")
#: What records.lua's finish() reads of a record, in this order (`FINISH_READS`, codes.lua):
#: end.lua reads them with the rest, so an end costs one read of its record.
_FINISH_READS = ("tenant", "asked_top", "ckey", "webhook")


def _ending() -> str:
    """ending.lua, for end.lua alone: from agent_server/model/record.py, the fields an end
    writes from its arguments, in their order (`END_WRITES`; `status` first), those it
    clears with their empty values (`END_CLEARS`, name then value) and those it reads
    (`END_READS`: _END_CHECKS, then the rest of the row it keeps as it is, which its notice
    carries); `END_MOVE(rec, found, at)`, the end's move with what it writes and clears
    (`at`: the index in ARGV of its first written value), and `END_ROW(at, v)`, the record
    as the end leaves it (F's order; `v`, what END_READS read), and `END_FINISH(v)`, what
    finish() would read again (`FINISH_READS`), taken from `v`. Code rather than loops over
    the tables: no table is built for the move's arguments (bench/RESULTS.md, "B38b")."""
    if record.END_WRITES[0].name != "status":
        raise RuntimeError("end.lua reads an end's status first: declare `status` first")
    written = [f.name for f in record.END_WRITES]
    cleared = {f.name: f.empty for f in record.END_CLEARS}
    kept = (f.name for f in record.FIELDS if f.at_end is record.AtEnd.KEPT)
    reads = _END_CHECKS + tuple(name for name in kept if name not in _END_CHECKS)
    reads += tuple(name for name in _FINISH_READS if name not in reads)
    finish = ", ".join(f"v[{reads.index(name) + 1}]" for name in _FINISH_READS)

    def arg(name: str) -> str:
        n = written.index(name)
        return f"ARGV[at + {n}]" if n else "ARGV[at]"

    pairs = [f"'{name}', {arg(name)}" for name in written[1:]]
    pairs += [f"'{name}', '{empty}'" for name, empty in cleared.items()]
    row = []
    for f in record.FIELDS:
        if f.name in cleared:
            row.append(f"'{cleared[f.name]}'")
        else:
            row.append(arg(f.name) if f.name in written else f"v[{reads.index(f.name) + 1}]")
    clears = ", ".join(f"'{name}', '{empty}'" for name, empty in cleared.items())
    return (
        "-- Made from agent_server/model/record.py by agent_server/store/redis/scripts.py.\n"
        "--! include moves.lua\n"
        f"local END_WRITES = {_names(record.END_WRITES)}\n"
        f"local END_CLEARS = {{{clears}}}\n"
        "local END_READS = {" + ", ".join(f"'{name}'" for name in reads) + "}\n"
        "local function END_MOVE(rec, found, at)\n"
        "  move(rec, END_OF[ARGV[at]], found, ARGV[at],\n"
        f"    {', '.join(pairs)})\n"
        "end\n"
        "local function END_ROW(at, v)\n"
        f"  return {{{', '.join(row)}}}\n"
        "end\n"
        "local function END_FINISH(v)\n"
        f"  return {{{finish}}}\n"
        "end\n"
    )


#: The files made here rather than read from `lua/`.
_MADE = {"codes.lua": _codes, "record.lua": _record, "ending.lua": _ending}


def _read(name: str) -> str:
    if name in _MADE:
        return _MADE[name]()
    return resources.files(__package__).joinpath("lua").joinpath(name).read_text(encoding="utf-8")


def expand(text: str) -> str:
    """`text` with its includes inlined, each once, in the order first named."""
    seen: set[str] = set()

    def include(file: str) -> str:
        if file in seen:
            return ""
        seen.add(file)
        return _INCLUDE.sub(lambda m: include(m.group(1)), _read(file))

    return _INCLUDE.sub(lambda m: include(m.group(1)), text)


def load(name: str) -> str:
    """The script `name` with its includes inlined, each once, in the order first named."""
    return expand(f"--! include {name}.lua")


_EACH_CALL = re.compile(r"^--! each call\n(.*?)^--! end each call\n", re.MULTILINE | re.DOTALL)
#: Every library's name and its functions' start with this (the rest: script, digest).
PREFIX = "agent_server_"


def library(name: str) -> tuple[str, str]:
    """Script `name` as a Redis function library: its function's name, and the library's
    code. The included files' definitions run once, at load; their `--! each call` lines
    (the common arguments, Redis's clock, the keys every script shares) become `OPEN`, run
    first on each call; the script's own code is `BODY`. As an `EVAL` the same files run top
    to bottom (the markers are comments): `load` is that script."""
    own = _read(f"{name}.lua")
    body = _INCLUDE.sub("", own)
    opened: list[str] = []

    def each(match: re.Match[str]) -> str:
        opened.append(f"  do\n{match.group(1)}  end\n")
        return ""

    includes = "\n".join(line for line in own.splitlines() if _INCLUDE.match(line))
    shared = _EACH_CALL.sub(each, expand(includes))
    code = (
        f"local KEYS, ARGV\n{shared}\n"
        f"local function OPEN(keys, args)\n  KEYS, ARGV = keys, args\n{''.join(opened)}end\n"
        f"local function BODY()\n{body}\nend\n"
    )
    function = f"{PREFIX}{name}_{hashlib.sha1(code.encode()).hexdigest()[:16]}"
    return function, (
        f"#!lua name={function}\n{code}"
        f"redis.register_function('{function}', function(keys, args)\n"
        "  OPEN(keys, args)\n  return BODY()\nend)\n"
    )


#: The text of every script as an `EVAL` would run it, by name.
SCRIPTS = {name: load(name) for name in NAMES}
#: Every script's function name and library, by name.
LIBRARIES = {name: library(name) for name in NAMES}
#: What calls each script, by name: `FCALL` and its function's name, as bytes (packed as
#: they are).
FCALL = {name: (b"FCALL", function.encode()) for name, (function, _) in LIBRARIES.items()}
