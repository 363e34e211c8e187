"""Execution ids: random UUID 4s, unique across pool refills and across a fork."""

from __future__ import annotations

import os
import uuid

from agent_server.model.ids import RandomIds, new_execution_id


def test_ids_are_uuid4_hex_and_unique_across_refills() -> None:
    ids = RandomIds()
    made = [ids.new() for _ in range(3 * RandomIds.POOL_BYTES // 16 + 5)]
    assert len(set(made)) == len(made)
    for value in made:
        parsed = uuid.UUID(hex=value)
        assert parsed.hex == value
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_a_forked_child_does_not_repeat_its_parents_next_id() -> None:
    new_execution_id()  # the pool is filled, so a child without a fresh one would reuse it
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write one id and leave at once (no pytest teardown here)
        try:
            os.write(write_end, new_execution_id().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        child_id = os.read(read_end, 64).decode()
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(child_id) == 32
    assert child_id != new_execution_id()
