-- agent-server's Postgres store, schema version 3: retention reads only what it deletes.
-- The trim (owner.py `_trim`) takes the oldest finished records in the order
-- `finished, id`: with `id` in the index the scan stops at its LIMIT, where an index on
-- `finished` alone fetched every finished record and sorted them, at each trim (8 ms at
-- 10,000 kept, and more as they grow: bench/RESULTS.md, "PG5"). The expiry pass
-- (store.py `_retention`) finds what expired by its own index, not a scan of the table.

DROP INDEX executions_finished;
CREATE INDEX executions_finished ON executions (agent, finished, id)
    WHERE finished IS NOT NULL;
CREATE INDEX executions_expiring ON executions (agent, expires_at)
    WHERE expires_at IS NOT NULL;
