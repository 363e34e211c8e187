"""Every field a store keeps is declared once (agent_server/model/record.py), hash-only fields
included, and `Execution`, the Redis codec and the scripts follow that declaration: a field
a script writes or reads that the declaration lacks, or one the declaration holds that
nothing stores, fails here."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest

from agent_server.model import record
from agent_server.model.execution import Execution
from agent_server.model.live import INITIAL
from agent_server.model.status import CancelReason, ExecutionStatus
from agent_server.store.redis import codec, scripts

#: The hash commands a script names a record's fields in.
_HASH_COMMANDS = {"HSET", "HGET", "HMGET", "HDEL", "HSTRLEN", "HEXISTS", "HSETNX", "HINCRBY"}
#: How the scripts name an execution's record: `rec`, `P .. 'x:' .. id`, or emit.lua's KEYS[1].
_RECORD_KEY = re.compile(r"^(rec|P \.\. 'x:' \.\. \w+|KEYS\[1\])$")
_CALL = re.compile(r"redis\.call\('(H[A-Z]+)',")


def _arguments(text: str, start: int) -> list[str]:
    """The arguments of the call whose '(' is just before `start`, split at its own commas."""
    depth, quote, current, out = 0, "", "", []
    for char in text[start:]:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "({":
            depth += 1
        elif char in ")}":
            if depth == 0:
                break
            depth -= 1
        elif char == "," and depth == 0:
            out.append(current.strip())
            current = ""
            continue
        current += char
    out.append(current.strip())
    return out


def named_fields() -> dict[str, set[str]]:
    """Each record field a script names (`answer:` for `'answer:' .. n`), with the scripts."""
    found: dict[str, set[str]] = {}
    lua = resources.files(scripts.__package__).joinpath("lua")
    for path in lua.iterdir():
        text = path.read_text(encoding="utf-8")
        for call in _CALL.finditer(text):
            command = call.group(1)
            args = _arguments(text, call.start() + len("redis.call("))
            if command not in _HASH_COMMANDS or not _RECORD_KEY.match(args[1]):
                continue
            fields = args[2::2] if command in ("HSET", "HSETNX", "HINCRBY") else args[2:]
            for arg in fields:
                literal = re.fullmatch(r"'([a-z_]+:?)'(?: \.\. .+)?", arg)
                if literal is not None:
                    found.setdefault(literal.group(1), set()).add(path.name)
    return found


def test_every_field_a_script_names_is_declared() -> None:
    named = named_fields()
    declared = {f.hash_name for f in record.STORED}
    assert {"status", "asking", "answer:", "parked_by", "ckey", "webhook"} <= set(named)
    assert set(named) - declared == set(), "declare these in agent_server/model/record.py"


def test_every_declared_field_is_stored() -> None:
    """Each declared field is named by a script, or is a row field (every script returns
    `F`), or is written with the record by the codec."""
    named = set(named_fields())
    made = {f.name for f in record.HASH_FIELDS if f.written is not record.Written.BY_SCRIPTS}
    for f in record.STORED:
        assert f.kept is record.Kept.ROW or f.hash_name in named or f.name in made, f.name


def test_pattern_fields_are_dropped_with_the_requests() -> None:
    """records.lua drops what `requests` marks, made into record.lua from the declaration."""
    made = scripts.load("end")
    for f in record.PER_REQUEST:
        assert f"'{f.name}:'" in made.split("local PER_REQUEST", 1)[1].split("\n", 1)[0]
    assert {f.name for f in record.REQUESTS_KEPT} == {"asked_top", "answer_bytes", "answers_from"}


def test_execution_holds_each_field_it_keeps_and_the_live_state_apart() -> None:
    slots = set(Execution.__slots__) | set(INITIAL)
    assert {f.slot for f in record.HELD} | set(INITIAL) == slots
    assert not {f.slot for f in record.HELD} & set(INITIAL)
    execution = Execution("echo", None, replica="r-1")
    for f in record.HELD:
        value = getattr(execution, f.slot)
        assert f.default is record.REQUIRED or value == f.default, f.name
    copy = Execution.restore(
        execution_id="a" * 32, reasoner="echo", session_id=None, status=ExecutionStatus.QUEUED,
        created_at=1.0, replica="", attempt=3, status_reason=CancelReason.REQUEST,
    )  # fmt: skip
    assert copy.cancel_reason is CancelReason.REQUEST and copy.started_monotonic == 0.0
    assert copy.max_attempts == 1 and copy.body is None and copy.events is None
    with pytest.raises(TypeError):
        Execution.restore(execution_id="a" * 32, reasoner="echo")  # the row's fields are required


def _as_redis_returns(values: list[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def _records() -> list[Execution]:
    plain = Execution("echo", "s-1", replica="r-1", attempt=2)
    done = Execution("echo", None, replica="r-1")
    done.finish(ExecutionStatus.SUCCEEDED, result={"n": [1, 2.5, "é"], "big": 2**70})
    failed = Execution("echo", None, replica="r-1")
    failed.abandoned = True
    failed.finish(ExecutionStatus.CANCELLED, reason=CancelReason.SHUTDOWN)
    broken = Execution("echo", None, replica="r-1")
    broken.finish(ExecutionStatus.FAILED, error={"type": "ValueError", "message": "no"})
    asking = Execution("ask", None, replica="r-2")
    asking.ask({"request_id": 1, "prompt": "?", "schema": None, "asked_at": "x"})
    queued = Execution("later", None)
    queued.enqueue(1_800_000_000.25)
    return [plain, done, failed, broken, asking, queued]


@pytest.mark.parametrize("execution", _records(), ids=lambda e: e.status.value)
def test_the_codec_reads_back_what_it_writes(execution: Execution) -> None:
    values = codec.new_record(execution)
    row = _as_redis_returns(values[: len(record.FIELDS)])
    read = codec.from_row(row)
    for f in record.FIELDS:
        assert getattr(read, f.attr or "") == getattr(execution, f.attr or ""), f.name
    pairs = values[len(record.FIELDS) :]
    extra = dict(zip(pairs[::2], pairs[1::2], strict=True))
    assert set(extra) <= {f.name for f in record.HASH_FIELDS}


def test_the_hash_only_fields_written_with_the_record_read_back() -> None:
    execution = Execution("steps", None, replica="r-1")
    execution.resumable, execution.body, execution.max_attempts = True, {"count": 3}, 4
    execution.webhook_url, execution.trace = "https://example.test/hook", "00-" + "a" * 51
    values = codec.new_record(execution)[len(record.FIELDS) :]
    extra = dict(zip(_as_redis_returns(values[::2]), _as_redis_returns(values[1::2]), strict=True))
    assert set(extra) == {"body", "max_attempts", "webhook", "trace"}
    copy = Execution("steps", None)
    codec.read_into(copy, extra)
    assert (copy.body, copy.max_attempts) == ({"count": 3}, 4)
    assert (copy.webhook_url, copy.trace) == (execution.webhook_url, execution.trace)
    plain = codec.new_record(Execution("echo", None, replica="r-1"))
    assert len(plain) == len(record.FIELDS)  # nothing more for an execution that sets none


def test_an_end_s_arguments_are_the_declared_writes_in_order() -> None:
    execution = Execution("echo", None, replica="r-1", attempt=2)
    execution.finish(ExecutionStatus.FAILED, error={"type": "E", "message": "m"})
    args = _as_redis_returns(codec.end_args(execution))
    assert args[:3] == [execution.execution_id, "r-1", "2"]
    ended = dict(zip((f.name for f in record.END_WRITES), args[3:], strict=True))
    assert ended["status"] == "failed" and ended["abandoned"] == "0"
    made = scripts.load("end")
    writes = ", ".join(f"'{f.name}'" for f in record.END_WRITES)
    assert f"local END_WRITES = {{{writes}}}" in made
    assert "'input_request', 'null'" in made.split("local END_CLEARS", 1)[1].split("\n", 1)[0]
