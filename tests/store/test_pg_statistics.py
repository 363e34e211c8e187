"""The planner's statistics after a burst (agent_server/store/postgres/statistics.py), on a
real PostgreSQL: 50,000 executions written at once leave the planner the statistics of the
empty table, which plans a batch of ends by hashing every row; the store's refresh analyzes
the table, after which the batch finds its rows by the primary key; and it analyzes only
past its bound (a second refresh does nothing)."""

from __future__ import annotations

import asyncio
import time

import psycopg

from agent_server.store.postgres import statistics
from tests.support.stores import AGENT, Recorder, closed, open_postgres

ROWS = 50_000
#: A batch of ends joined against the table as owner.py's `_ends` joins it (its keys).
ENDS_PLAN = (
    "EXPLAIN WITH given (id, owner, attempt) AS (SELECT * FROM unnest(%s::text[],"
    " %s::text[], %s::integer[])) UPDATE executions e SET status = 'succeeded' FROM given g"
    " WHERE e.agent = %s AND e.id = g.id AND e.replica = g.owner AND e.attempt = g.attempt"
    " AND e.status IN ('running', 'input_required')"
)


def _plan(conn: psycopg.Connection) -> str:
    ids = [f"id{n}" for n in range(1, 201)]
    rows = conn.execute(ENDS_PLAN, (ids, ["A"] * 200, [1] * 200, AGENT)).fetchall()
    return "\n".join(str(row[0]) for row in rows)


def _changed(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'executions'"
    ).fetchone()
    return int(row[0]) if row else 0


async def test_a_burst_is_analyzed_and_a_batch_of_ends_then_uses_the_key(
    postgres_url: str,
) -> None:
    store = open_postgres(postgres_url, "A", Recorder())
    await store.open()  # the schema, and a first ANALYZE-free look at an empty table
    await closed(store)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("ANALYZE executions")  # as an empty table was last seen
        conn.execute(
            "INSERT INTO executions (agent, id, status, reasoner, created_at, replica, attempt,"
            " doc) SELECT %s, 'id' || g, 'running', 'echo', g, 'A', 1, '{}'"
            " FROM generate_series(1, %s) g",
            (AGENT, ROWS),
        )
        deadline = time.monotonic() + 10  # Postgres counts the rows within a second or so
        while _changed(conn) < ROWS:
            assert time.monotonic() < deadline, "Postgres never counted the burst"
            await asyncio.sleep(0.1)
        assert "executions_pkey" not in _plan(conn)  # planned for the empty table
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as a:
            assert await statistics.refresh(a) == ["executions"]
            assert await statistics.refresh(a) == []  # nothing changed since
        assert "executions_pkey" in _plan(conn)
        (tuples,) = conn.execute(
            "SELECT reltuples FROM pg_class WHERE relname = 'executions'"
        ).fetchone() or (0,)
        assert tuples >= ROWS * 0.9


async def test_a_few_changes_are_left_to_autovacuum(postgres_url: str) -> None:
    store = open_postgres(postgres_url, "A", Recorder())
    await store.open()
    await closed(store)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (agent, id, status, reasoner, created_at, replica, attempt,"
            " doc) SELECT %s, 'id' || g, 'running', 'echo', g, 'A', 1, '{}'"
            " FROM generate_series(1, %s) g",
            (AGENT, 100),
        )
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as a:
        assert await statistics.refresh(a) == []
