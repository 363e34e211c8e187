"""lua/moves.lua on a real Redis: a script's move is checked against the table of
agent_server/model/status.py (a move it lacks is an error reply that writes nothing), clears
what the move declares, queues through one function, and reads `parked` as Python does."""

from __future__ import annotations

import json

import pytest
import redis

from agent_server.model import status
from agent_server.model.status import OWNED, ExecutionStatus
from agent_server.store.redis import scripts

pytestmark = pytest.mark.redis

#: header.lua's common arguments: result_ttl (ms), "{max_retained}:{max_retained_bytes}", ME.
HEADER = ("60000", "100:1000000", "tester")
#: A record holding every field some move clears, and one none does.
HELD = {
    "input_request": '{"request_id": 1}',
    "asking": "1",
    "replica": "A",
    "parked_by": "A|1",
    "claim": "token",
    "scheduled_at": "5.0",
    "result": "7",
}


def script(client: redis.Redis, body: str) -> redis.commands.core.Script:
    return client.register_script(scripts.expand(f"--! include moves.lua\n{body}"))


def text(client: redis.Redis, key: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(key).items()}


def test_a_script_makes_only_the_moves_the_table_holds(redis_url: str) -> None:
    """Every transition tried from every status to every status, by move()."""
    client = redis.Redis.from_url(redis_url)
    move = script(client, "move(KEYS[1], ARGV[4], ARGV[5], ARGV[6], 'mine', 'yes')\nreturn 1")
    made = 0
    for row in status.TABLE:
        for source in ExecutionStatus:
            for target in ExecutionStatus:
                key = f"x:{row.transition.value}:{source.value}:{target.value}"
                client.hset(key, mapping={"status": source.value, **HELD})
                before = text(client, key)
                args = [*HEADER, row.transition.value, source.value, target.value]
                if row.sources and source in row.sources and target in row.targets:
                    assert move(keys=[key], args=args) == 1
                    expected = {**before, "status": target.value, "mine": "yes"}
                    for name in status.clears(row.transition, target):
                        expected[name] = "null" if name == "input_request" else ""
                    found = text(client, key)
                    # A move but a creation or an end joins the record's history.
                    kept = json.loads(found.pop("moves", "[]"))
                    assert found.pop("moves_n", "0") == str(len(kept))
                    assert found == expected, (row.transition, target)
                    if status.keeps_move(target):
                        assert [entry[1:3] for entry in kept] == [[source.value, target.value]]
                    else:
                        assert kept == [], (row.transition, target)
                    made += 1
                else:  # a creation is no move (created() checks those), nor anything else
                    with pytest.raises(redis.ResponseError, match="not a move"):
                        move(keys=[key], args=args)
                    assert text(client, key) == before
    assert made == sum(len(row.sources) * len(row.targets) for row in status.TABLE)


def test_a_new_record_has_the_status_its_creation_makes(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    created = script(client, "created(ARGV[4], ARGV[5])\nreturn 1")
    for row in status.TABLE:
        for target in ExecutionStatus:
            args = [*HEADER, row.transition.value, target.value]
            if not row.sources and target in row.targets:
                assert created(args=args) == 1
            else:
                with pytest.raises(redis.ResponseError, match="not a creation"):
                    created(args=args)


def test_to_queued_is_the_move_then_the_queue_then_the_notice(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    to_queued = script(
        client,
        "to_queued(KEYS[1], ARGV[4], MOVE_HAND_OFF, ARGV[5], KEYS[2], ARGV[6] == '1', KEYS[3],"
        " 'attempt', '2')\nreturn 1",
    )
    pubsub = client.pubsub()
    pubsub.subscribe("queued")
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    client.rpush("queue", "earlier")
    for execution_id, head in (("b", "0"), ("a", "1")):
        client.hset(f"x:{execution_id}", mapping={"status": "running", **HELD})
        args = [*HEADER, execution_id, ExecutionStatus.RUNNING.value, head]
        assert to_queued(keys=[f"x:{execution_id}", "queue", "queued"], args=args) == 1
        record = text(client, f"x:{execution_id}")
        assert record["status"] == ExecutionStatus.QUEUED.value and record["attempt"] == "2"
        assert all(record[name] in ("", "null") for name in status.QUEUED_CLEARS), record
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["data"] == execution_id.encode()
    assert client.lrange("queue", 0, -1) == [b"a", b"earlier", b"b"]  # head, tail
    # From a status the move does not leave: refused before anything is queued or told.
    with pytest.raises(redis.ResponseError, match="not a move"):
        to_queued(keys=["x:a", "queue", "queued"], args=[*HEADER, "a", "queued", "0"])
    assert client.lrange("queue", 0, -1) == [b"a", b"earlier", b"b"]
    assert pubsub.get_message(timeout=0.2) is None
    pubsub.close()


def test_parked_reads_the_same_in_lua_as_in_python(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    read = script(
        client,
        "return {parked(ARGV[4], ARGV[5]) and 1 or 0, unowned(ARGV[4], ARGV[5]) and 1 or 0,"
        " held(ARGV[4], ARGV[5]) and 1 or 0}",
    )
    for each in ExecutionStatus:
        for owner in ("", "A"):
            parked = status.parked(each, owner)
            held = each in OWNED and owner != ""  # an owner's task runs it
            expected = [int(parked), int(status.unowned(each, owner)), int(held)]
            assert read(args=[*HEADER, each.value, owner]) == expected, (each, owner)


def test_a_history_keeps_its_last_moves_however_many_are_made(redis_url: str) -> None:
    """Each kept move is appended to the record's `moves` (as text, never decoded) and
    counted in `moves_n`; past twice KEPT_MOVES the oldest go at once, so what is stored
    stays bounded and every move costs the same. The last KEPT_MOVES read back in order."""
    client = redis.Redis.from_url(redis_url)
    move = script(client, "move(KEYS[1], ARGV[4], ARGV[5], ARGV[6])\nreturn 1")
    key = "x:history"
    client.hset(key, mapping={"status": "running", "replica": "A", "attempt": "1"})
    made = 5 * status.KEPT_MOVES + 3
    for n in range(made):
        source, target = ("running", "queued") if n % 2 == 0 else ("queued", "running")
        transition = "retry" if n % 2 == 0 else "claim"
        client.hset(key, "attempt", str(n // 2 + 1))
        assert move(keys=[key], args=[*HEADER, transition, source, target]) == 1
        stored = json.loads(client.hget(key, "moves") or b"[]")
        assert len(stored) == int(client.hget(key, "moves_n") or 0)
        assert len(stored) < 2 * status.KEPT_MOVES
    last = json.loads(client.hget(key, "moves") or b"[]")[-status.KEPT_MOVES :]
    expected = [
        ("retry" if n % 2 == 0 else "claim", n // 2 + 1)
        for n in range(made - status.KEPT_MOVES, made)
    ]
    assert [(entry[6], entry[3]) for entry in last] == expected
    times = [entry[0] for entry in last]
    assert times == sorted(times)
