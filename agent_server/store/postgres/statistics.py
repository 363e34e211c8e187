"""The planner's statistics kept fresh by the store itself after a burst of writes.

A table filled faster than autovacuum looks (its launcher wakes once a minute) is planned
from the statistics of the table it was: 100,000 executions started in half a minute are
still, to the planner, the empty table it last analyzed, and a drain's batch of 200 ends
hashed all 100,000 rows to find them (52 ms a batch, where the primary key finds them in 3;
bench/RESULTS.md, "R55f"). The liveness pass asks Postgres's own count of the rows changed
since each table's last ANALYZE and analyzes a table past autovacuum's kind of bound
itself: promptly, and once for all replicas (the count starts again for everyone).
"""

from __future__ import annotations

from agent_server.store.postgres.link import Conn

#: The tables whose statements join by key against a batch of ids (ends, reads, claims).
TABLES = ("executions",)
#: A table is analyzed once more rows than CHANGED_FLOOR and CHANGED_SHARE of the rows it
#: had at its last ANALYZE have changed since.
CHANGED_FLOOR = 10_000
CHANGED_SHARE = 0.2


async def refresh(conn: Conn) -> list[str]:
    """ANALYZE each of TABLES changed past the bound since its last; those analyzed."""
    cursor = await conn.execute(
        "SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
        " WHERE s.schemaname = current_schema() AND s.relname = ANY(%s)"
        " AND s.n_mod_since_analyze > %s + %s * greatest(c.reltuples, 0)",
        (list(TABLES), CHANGED_FLOOR, CHANGED_SHARE),
    )
    stale = [str(row[0]) for row in await cursor.fetchall()]
    for table in stale:
        if table in TABLES:  # a name of ours, never one read from elsewhere
            await conn.execute(f"ANALYZE {table}")
    return stale
