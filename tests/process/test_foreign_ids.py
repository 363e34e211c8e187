"""Another tenant's execution id costs what an unknown one costs, on every store: the same
404 bytes, and on Redis the same work, since the tenant is checked before the record is read
(a big record is never read for a caller who cannot see it).

A real `agent-server run tenancy_app:agent --api-tokens-file ...` on the memory store and on
Redis; on Redis the work is counted, not timed: the bytes Redis sends its clients (`INFO
stats`) while a batch of GETs of a foreign id and a batch of an unknown id are answered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.process.test_tenancy import ALICE, BOB, UNKNOWN_ID, tokens_file
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

WAIT = 20.0
APP = "tenancy_app:agent"
#: The result of the execution another tenant asks for (1 MiB): reading it whole shows.
BIG = 1024 * 1024
#: GETs in each batch compared.
READS = 8


@pytest.fixture(params=["memory", "redis"])
def server(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, redis_server: RedisServer
) -> Iterator[tuple[str, ServerProcess]]:
    flags = ["--api-tokens-file", str(tokens_file(tmp_path))]
    if request.param == "redis":
        flags += ["--store", redis_url]
    marker = tmp_path / "server"
    marker.mkdir()
    process = ServerProcess([APP, *flags], {}, marker)
    try:
        process.wait_ready()
        yield request.param, process
    finally:
        process.close()


def output_bytes(redis: RedisServer) -> int:
    """What Redis has sent its clients so far (INFO stats)."""
    reply = redis.command("INFO", "stats")
    assert reply is not None
    for line in reply.decode().splitlines():
        if line.startswith("total_net_output_bytes:"):
            return int(line.split(":", 1)[1])
    raise AssertionError("no total_net_output_bytes in INFO stats")


def test_a_foreign_id_is_answered_as_an_unknown_one_for_the_same_work(
    server: tuple[str, ServerProcess], redis_server: RedisServer
) -> None:
    kind, process = server
    alice = {"Authorization": f"Bearer {ALICE}"}
    bob = {"Authorization": f"Bearer {BOB}"}
    with httpx.Client(base_url=process.url, timeout=WAIT) as http:
        ran = http.post("/reasoners/sized", json={"size": BIG}, headers=alice)
        assert ran.status_code == 200, ran.text[:200]
        foreign_id = ran.json()["execution_id"]

        def batch(execution_id: str, headers: dict[str, str]) -> tuple[int, set[bytes]]:
            before = output_bytes(redis_server)
            bodies = set()
            for _ in range(READS):
                answer = http.get(f"/executions/{execution_id}", headers=headers)
                bodies.add(answer.content)
                assert answer.status_code in (200, 404)
            return output_bytes(redis_server) - before, bodies

        own, _ = batch(foreign_id, alice)
        unknown, unknown_bodies = batch(UNKNOWN_ID, bob)
        foreign, foreign_bodies = batch(foreign_id, bob)
    # The same bytes, on every store.
    assert foreign_bodies == unknown_bodies == {b'{"detail":"unknown execution"}'}
    if kind == "redis":
        assert own >= READS * BIG  # the count sees a record read whole
        # The same work: a renewal or a tick between the batches adds a little, never a
        # record (READS of them were read whole before the tenant was checked).
        assert abs(foreign - unknown) < BIG // 4, (foreign, unknown)
