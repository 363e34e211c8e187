-- agent-server's Postgres store, schema version 1 (docs/postgres.md).
-- Every row carries its agent: one database may serve several agents, as one Redis does.
-- Times the store decides by (leases, due times, expiry) are the database's clock.

CREATE TABLE executions (
    agent        text NOT NULL,
    id           text NOT NULL,
    -- Indexed, filtered or fenced on: written from the same object as `doc`.
    status       text NOT NULL,
    reasoner     text NOT NULL,
    session      text,              -- the session as scoped by its tenant (names.py)
    tenant       text,
    started_by   text,              -- the record's `owner`: the identity that started it
    schedule_id  text,
    created_at   double precision NOT NULL,
    replica      text NOT NULL,     -- the replica whose attempt holds it ('' nobody's)
    attempt      integer NOT NULL,
    -- The queue: due on the database's clock, in order of arrival.
    due_at       timestamptz,
    queued_seq   bigint,
    ckey         text,              -- concurrency key and its limit
    climit       integer NOT NULL DEFAULT 0,
    gated        boolean NOT NULL DEFAULT false,  -- waits for its session's turn
    -- Store-only fields (record.py `attr=None`).
    take         text NOT NULL DEFAULT '',
    unbegun      boolean NOT NULL DEFAULT false,
    retries      integer NOT NULL DEFAULT 0,
    ledger       text,              -- its requests for input, until it ends
    ask_expires  timestamptz,       -- a parked request's timeout
    parked_by    text,              -- "{owner}|{attempt}" that parked it: its events still land
    -- Versions (claims.py): the version that wrote its checkpoint ('' unversioned; NULL while
    -- it has none), and a checkpoint no replica could read, set aside by a restart.
    checkpoint_version text,
    checkpoint_aside text,
    -- Retention: a finished record is read until `expires_at`.
    finished     timestamptz,
    expires_at   timestamptz,
    result_bytes bigint NOT NULL DEFAULT 0,
    kept_bytes   bigint NOT NULL DEFAULT 0,  -- its input, result and error (--max-retained-bytes)
    doc          text NOT NULL,     -- every field Execution holds (codec.py)
    PRIMARY KEY (agent, id)
);
CREATE INDEX executions_newest ON executions (agent, created_at DESC, id DESC);
CREATE INDEX executions_tenant ON executions (agent, tenant, created_at DESC, id DESC)
    WHERE tenant IS NOT NULL;
CREATE INDEX executions_session ON executions (agent, session, created_at DESC, id DESC)
    WHERE session IS NOT NULL;
CREATE INDEX executions_queue ON executions (agent, due_at, queued_seq) WHERE status = 'queued';
CREATE INDEX executions_held ON executions (agent, replica)
    WHERE status IN ('running', 'input_required');
CREATE INDEX executions_keyed ON executions (agent, ckey)
    WHERE ckey IS NOT NULL AND status IN ('running', 'input_required');
CREATE INDEX executions_turns ON executions (agent, session, created_at)
    WHERE session IS NOT NULL AND status IN ('queued', 'running', 'input_required');
CREATE INDEX executions_finished ON executions (agent, finished) WHERE finished IS NOT NULL;
CREATE INDEX executions_parked ON executions (agent, ask_expires) WHERE ask_expires IS NOT NULL;
CREATE SEQUENCE executions_queue_seq;

-- What each agent retains: its finished records and their bytes (`kept_bytes`), counted by
-- the statements that finish records (owner.py `_ends`, part.py `_finish`: in the same
-- statement) and, for every delete, by the trigger below (once a statement): the trim of
-- --max-retained and --max-retained-bytes reads one row, never a scan of what is kept.
CREATE TABLE retained (
    agent        text PRIMARY KEY,
    records      bigint NOT NULL DEFAULT 0,  -- finished records kept (expired or not)
    bytes        bigint NOT NULL DEFAULT 0   -- their inputs, results and errors, as JSON
);
CREATE FUNCTION executions_forgotten() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO retained AS r (agent, records, bytes)
        SELECT agent, -count(*), -sum(kept_bytes) FROM gone
        WHERE finished IS NOT NULL GROUP BY agent
        ON CONFLICT (agent) DO UPDATE
        SET records = r.records + EXCLUDED.records, bytes = r.bytes + EXCLUDED.bytes;
    RETURN NULL;
END $$;
CREATE TRIGGER executions_forgotten AFTER DELETE ON executions
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION executions_forgotten();

CREATE TABLE idempotency (
    agent        text NOT NULL,
    key          text NOT NULL,     -- scoped by its tenant
    fingerprint  text NOT NULL,
    execution_id text NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (agent, key)
);
CREATE INDEX idempotency_expiry ON idempotency (expires_at);

CREATE TABLE replicas (
    agent        text NOT NULL,
    replica      text NOT NULL,
    expires_at   timestamptz NOT NULL,  -- its lease; 'epoch' once it closed it itself
    renewed_at   timestamptz NOT NULL,
    since        timestamptz NOT NULL,  -- when its current run of renewals began
    lease        double precision NOT NULL,
    advert       text NOT NULL DEFAULT '',
    state        text NOT NULL DEFAULT '',  -- what GET /replicas shows of it (JSON)
    PRIMARY KEY (agent, replica)
);

CREATE TABLE events (
    agent        text NOT NULL,
    execution_id text NOT NULL,
    seq          integer NOT NULL,
    event        text NOT NULL,
    data         text NOT NULL,
    PRIMARY KEY (agent, execution_id, seq)
);

CREATE TABLE releases (
    agent        text NOT NULL,
    session      text NOT NULL,
    release_id   text NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (agent, session)
);
CREATE TABLE release_answers (
    agent        text NOT NULL,
    release_id   text NOT NULL,
    answer       text NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (agent, release_id)
);

-- Requests for the owner of an execution: kept until it reads them (a lost notice costs
-- one poll, at most a second).
CREATE TABLE cancels (
    agent        text NOT NULL,
    replica      text NOT NULL,
    execution_id text NOT NULL,
    reason       text NOT NULL,
    settle_within double precision,
    PRIMARY KEY (agent, replica, execution_id)
);
CREATE TABLE answers (
    agent        text NOT NULL,
    replica      text NOT NULL,
    execution_id text NOT NULL,
    request_id   integer NOT NULL,
    value        text NOT NULL,
    PRIMARY KEY (agent, replica, execution_id, request_id)
);

CREATE TABLE webhooks (
    agent        text NOT NULL,
    delivery_id  text NOT NULL,
    type         text NOT NULL,
    url          text NOT NULL,
    at           double precision NOT NULL,
    due_at       timestamptz NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    data         text NOT NULL,
    trace        text,
    attempt      integer NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, delivery_id)
);
CREATE INDEX webhooks_due ON webhooks (agent, due_at);

CREATE TABLE schedules (
    agent        text NOT NULL,
    key          text NOT NULL,
    document     text NOT NULL,
    version      text NOT NULL,     -- its own: a replica reads again only what changed
    tenant       text,              -- counted in its tenant's schedules (--max-schedules)
    counted      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (agent, key)
);
CREATE INDEX schedules_tenant ON schedules (agent, tenant) WHERE counted;
CREATE TABLE schedule_marks (
    agent        text NOT NULL,
    key          text NOT NULL,
    created      double precision NOT NULL,
    handled      double precision,
    started      double precision,
    timing       text,
    PRIMARY KEY (agent, key)
);
CREATE TABLE schedules_version (
    agent        text PRIMARY KEY,
    version      text NOT NULL
);

ALTER TABLE executions SET (autovacuum_vacuum_scale_factor = 0.02);
