-- agent-server's Postgres store, schema version 2: each record's history (docs/console.md).
-- A record keeps its last 50 moves that neither create nor end it (status.py KEPT_MOVES),
-- each `[at, from, to, attempt, replica, version, how]` (status.py `kept_move`): `from`, `to`
-- name a record waiting for input that nobody owns `parked`; `attempt` and `replica` are
-- the attempt the move begins (to `running`) or leaves (any other); `version` the code that
-- ran the attempt left; `how` its name (status.py HOW, `how_of`), from what the row says:
-- to running from queued a claim, else a resume; an ask or a park; from parked to queued an
-- answer, or an expiry once its request's time is up; from an attempt to queued a requeue
-- (an owner's death counted in `retries`, or the same attempt given back), a retry (due at
-- a time: the document's `scheduled_at`), else a hand-off. Kept by a trigger, so every statement that moves a status (a claim,
-- a hand-off, the repair's requeue, an answer) keeps it alike; an end or a creation never
-- calls it (its WHEN), so an execution run once, start to end, pays nothing.

ALTER TABLE executions ADD COLUMN moves jsonb;

CREATE FUNCTION executions_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    begins boolean := NEW.status = 'running';
    kept jsonb;
BEGIN
    kept := COALESCE(OLD.moves, '[]'::jsonb) || jsonb_build_array(jsonb_build_array(
        extract(epoch FROM clock_timestamp()),
        CASE WHEN OLD.status = 'input_required' AND OLD.replica = '' THEN 'parked'
             ELSE OLD.status END,
        CASE WHEN NEW.status = 'input_required' AND NEW.replica = '' THEN 'parked'
             ELSE NEW.status END,
        CASE WHEN begins THEN NEW.attempt ELSE OLD.attempt END,
        CASE WHEN begins THEN NEW.replica ELSE OLD.replica END,
        -- `json`, not `jsonb`: the document is only scanned for the one key, whatever
        -- text (a lone surrogate escape) its other fields hold.
        CASE WHEN begins THEN NULL ELSE OLD.doc::json -> 'version' END,
        CASE
            WHEN begins THEN
                CASE WHEN OLD.status = 'queued' THEN 'claim' ELSE 'resume' END
            WHEN NEW.status = 'input_required' THEN
                CASE WHEN NEW.replica = '' THEN 'park' ELSE 'ask' END
            WHEN OLD.status = 'input_required' AND OLD.replica = '' THEN
                CASE WHEN OLD.ask_expires <= clock_timestamp() THEN 'expire' ELSE 'answer' END
            WHEN NEW.retries > OLD.retries OR NEW.attempt = OLD.attempt THEN 'requeue'
            WHEN NEW.doc::json ->> 'scheduled_at' IS NOT NULL THEN 'retry'
            ELSE 'hand_off'
        END));
    IF jsonb_array_length(kept) > 50 THEN
        kept := kept - 0;
    END IF;
    NEW.moves := kept;
    RETURN NEW;
END $$;
CREATE TRIGGER executions_moved BEFORE UPDATE OF status ON executions
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('queued', 'running', 'input_required'))
    EXECUTE FUNCTION executions_moved();
