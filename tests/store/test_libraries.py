"""The scripts run as Redis functions (agent_server/store/redis/scripts.py `library`,
libraries.py), on a real redis-server: a Redis that lost them (its functions flushed) gets
them again on the next call, which is answered; a library no replica of the agent loaded for
a day is deleted when a replica loads its own, and a recent one (another version, mid
rollout) is kept; a library each script's file defines once is the same script an `EVAL` of
the file runs."""

from __future__ import annotations

import pytest
import redis

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.store.redis import libraries, scripts
from tests.support.stores import Recorder, closed, open_redis

pytestmark = pytest.mark.redis

OLD = "agent_server_get_00000000000000aa"
RECENT = "agent_server_get_00000000000000bb"


def _library(name: str) -> str:
    return f"#!lua name={name}\nredis.register_function('{name}', function() return 1 end)\n"


def _functions(client: redis.Redis) -> set[str]:
    # Each library as Redis lists it: [b"library_name", name, b"engine", ...].
    return {str(entry[entry.index("library_name") + 1]) for entry in client.function_list()}


async def test_a_redis_that_lost_the_functions_gets_them_again_and_answers(
    redis_url: str,
) -> None:
    store = open_redis(redis_url, "A", Recorder())
    await store.open()
    try:
        execution = Execution("echo", None, "A")
        await store.create(execution)
        with redis.Redis.from_url(redis_url, decode_responses=True) as client:
            ours = {function for function, _ in scripts.LIBRARIES.values()}
            assert ours <= _functions(client)
            assert client.execute_command("FUNCTION", "FLUSH") == "OK"
            assert not ours & _functions(client)
            found = await store.get(execution.execution_id)
            assert found is not None and found.status is ExecutionStatus.RUNNING
            assert ours <= _functions(client)
    finally:
        await closed(store)


async def test_an_idle_library_is_deleted_and_a_recent_one_kept(redis_url: str) -> None:
    store = open_redis(redis_url, "A", Recorder())
    registry = store.keys.libraries
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        for name in (OLD, RECENT):
            client.execute_command("FUNCTION", "LOAD", "REPLACE", _library(name))
        seconds, micros = client.time()
        now = seconds * 1000 + micros // 1000
        client.hset(registry, mapping={OLD: now - libraries.IDLE_MS - 1, RECENT: now - 60_000})
        await store.open()
        try:
            present = _functions(client)
            assert OLD not in present and RECENT in present
            marked = client.hgetall(registry)
            assert OLD not in marked and RECENT in marked
            # Every library of this version is marked in use, at Redis's time of the load.
            for function, _ in scripts.LIBRARIES.values():
                assert int(marked[function]) >= now
        finally:
            await closed(store)
            client.execute_command("FUNCTION", "DELETE", RECENT)


async def test_a_library_runs_the_script_an_eval_of_its_file_runs(redis_url: str) -> None:
    """`get` of an unknown id, both ways: the same reply (one `false` per id)."""
    store = open_redis(redis_url, "A", Recorder())
    await store.open()
    try:
        keys = store.keys.script.for_ids(["x"])
    finally:
        await closed(store)
    with redis.Redis.from_url(redis_url) as client:
        function, code = scripts.LIBRARIES["get"]
        assert code.startswith(f"#!lua name={function}\n")
        common = [3600000, b"100:1000", b"A"]
        by_eval = client.eval(scripts.SCRIPTS["get"], len(keys), *keys, *common, b"", b"x")
        by_function = client.fcall(function, len(keys), *keys, *common, b"", b"x")
        assert by_eval == by_function == [None]
