"""The Redis hash of a record is what agent_server/model/record.py declares: a create writes
the row and the hash-only fields made with it, an end writes END_WRITES and clears
END_CLEARS, and the requests for input go with the end, on a real redis-server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis

from agent_server.model import record
from agent_server.model.asks import Found, Question
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.store.redis import RedisStore
from agent_server.store.redis.codec import end_args
from tests.support.stores import BOUND, Recorder, closed, open_redis

pytestmark = pytest.mark.redis


async def _hash(store: RedisStore, execution: Execution) -> dict[str, str]:
    found: dict[Any, Any] = await store._link.redis.hgetall(
        store.keys.record(execution.execution_id)
    )
    return {_text(k): _text(v) for k, v in found.items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def test_an_end_writes_and_clears_the_declared_fields_and_drops_the_requests(
    redis_url: str,
) -> None:
    store = open_redis(redis_url, "A", Recorder())
    await store.open()
    try:
        execution = Execution("ask", "s-9", "A")
        execution.webhook_url = "https://example.test/hook?token=t"
        execution.trace = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
        await store.create(execution)
        made = await _hash(store, execution)
        # `claim`: the create's take token (its store writes it with the record).
        assert set(made) == {f.name for f in record.FIELDS} | {"webhook", "trace", "claim"}
        asked = Question({"request_id": 1, "prompt": "why?", "schema": None}, "i-1", "why", 0)
        assert (await store.ask(execution, asked, False, None)).found is Found.WAIT
        execution.ask(asked.request)
        waiting = await _hash(store, execution)
        assert waiting["asking"] == "1" and waiting["status"] == "input_required"
        assert {"ident:1", "label:1", "asked_top"} <= set(waiting)

        execution.finish(ExecutionStatus.SUCCEEDED, result={"because": "é" * 3})
        store.end(execution)
        assert await store.recorded(execution, BOUND)
        ended = await _hash(store, execution)
        written = [_text(v) for v in end_args(execution)[3:]]
        assert [ended[f.name] for f in record.END_WRITES] == written
        assert {f.name: ended[f.name] for f in record.END_CLEARS} == {
            f.name: f.empty for f in record.END_CLEARS
        }
        gone = [f.hash_name for f in record.PER_REQUEST] + [f.name for f in record.REQUESTS_KEPT]
        assert [name for name in ended if name.startswith(tuple(gone))] == []
        assert (ended["webhook"], ended["trace"]) == (execution.webhook_url, execution.trace)
        read = await store.get(execution.execution_id)
        assert read is not None and read.to_json() == execution.to_json()
    finally:
        await closed(store)


async def test_an_end_notice_carries_the_record_as_redis_then_holds_it(redis_url: str) -> None:
    """The `end` script builds the row its notice carries from what it wrote, what it cleared
    and what it read (ending.lua's END_ROW): each field as the hash holds it after the end,
    for every terminal status and a record with a session and an attempt past the first."""
    store = open_redis(redis_url, "A", Recorder())
    await store.open()
    listener = redis.Redis.from_url(redis_url)
    pubsub = listener.pubsub()
    try:
        await asyncio.to_thread(pubsub.subscribe, store.keys.ends)
        assert (await asyncio.to_thread(pubsub.get_message, timeout=BOUND))["type"] == "subscribe"
        ends = {
            ExecutionStatus.SUCCEEDED: {"result": {"n": [1, "é"]}},
            ExecutionStatus.FAILED: {"error": {"type": "E", "message": "m"}},
            ExecutionStatus.CANCELLED: {},
            ExecutionStatus.LOST: {"error": {"type": "ExecutionLost", "message": "gone"}},
        }
        for status, fields in ends.items():
            execution = Execution("echo", f"s-{status.value}", "A", attempt=3)
            await store.create(execution)
            execution.finish(status, **fields)
            store.end(execution)
            assert await store.recorded(execution, BOUND)
            message = await asyncio.to_thread(pubsub.get_message, timeout=BOUND)
            assert message is not None and message["type"] == "message"
            writer, _, body = message["data"].decode().partition(" ")
            assert writer == "@A"
            (row,) = json.loads(body)
            held = await store._link.redis.hmget(
                store.keys.record(execution.execution_id), [f.name for f in record.FIELDS]
            )
            assert row == [_text(v) for v in held], status
            assert row[record.FIELDS.index(record.BY_NAME["status"])] == status.value
    finally:
        pubsub.close()
        listener.close()
        await closed(store)
