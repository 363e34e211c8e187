--[[ judge: reading a record, and the verdict on its owner (section 12, invariant 2).
  KEYS[1..6]: records.lua's; KEYS[7..8] (of every script that includes this file):
  `replicas`, `renewals`. A script's own keys start at KEYS[9].
  Defines: REPLICAS, RENEWALS, judged(owner), read(id, rec, ev).
]]
--! include records.lua
-- MINE: this caller's renewals (see renew()): nil until read, false when it has none.
local REPLICAS, RENEWALS, MINE
--! each call
REPLICAS, RENEWALS, MINE = KEYS[7], KEYS[8], nil
--! end each call

-- Whether `owner` may be judged by this caller: the verdict rests on the store's evidence
-- alone, decided here, when the script runs (a command sent before a pause runs after it).
-- The owner's lease has lapsed on Redis's clock (or it closed it), and this caller renewed
-- its own continuously (no gap over half its lease, the last one recent) for at least a
-- whole lease before now. A pause, restart or cut of Redis stops everyone's renewals, so
-- after one nobody judges until each live replica has had a whole lease to renew again, and
-- one that lapsed during it OUTAGE_LEASES of them.
local function judged(owner)
  local expiry = redis.call('ZSCORE', REPLICAS, owner)
  if expiry and tonumber(expiry) > NOW then return false end
  if MINE == nil then
    MINE = false
    local r = redis.call('HGET', RENEWALS, ME)
    if r then
      local last, since, lease = string.match(r, '^(%d+)|(%d+)|(%d+)$')
      MINE = {last = tonumber(last), since = tonumber(since), lease = tonumber(lease)}
    end
  end
  if not MINE or NOW - MINE.last > MINE.lease / 2 then return false end
  if expiry and tonumber(expiry) == 0 then return true end  -- it ended its liveness itself
  if MINE.since > NOW - MINE.lease then return false end
  -- An owner whose lease lapsed before this caller's run began (an outage stopped every
  -- renewal, and it has not renewed since: slower to reconnect) is given OUTAGE_LEASES of
  -- this caller's leases (store/values.py): a store outage is nobody's death.
  if expiry and tonumber(expiry) < MINE.since then
    return MINE.since <= NOW - OUTAGE_LEASES * MINE.lease
  end
  return true
end

-- Queued again, it runs nowhere: out of `running` and of its owner's `owned` set.
local function disown(id, owner)
  redis.call('ZREM', RUNNING, id)
  redis.call('SREM', P .. 'owned:' .. owner, id)
end

-- The record's fields plus MOVED_LOST when this call moved it to lost (its owner stopped
-- renewing its liveness), MOVED_QUEUED when it queued its next attempt instead, else
-- MOVED_NOT; false when unknown. rec and ev, its hash and stream, are named from the prefix
-- when not given (an id learned inside the script).
local function read(id, rec, ev)
  rec = rec or (P .. 'x:' .. id)
  local v = redis.call('HMGET', rec, unpack(F))
  if not v[I_EXECUTION_ID] then return false end
  local moved = MOVED_NOT
  -- An owner waiting for input (its task in ctx.ask) is judged like a running one; a
  -- parked execution has no owner to judge.
  if held(v[I_STATUS], v[I_REPLICA]) and judged(v[I_REPLICA]) then
    local r = redis.call('HMGET', rec, 'max_attempts', 'retries', 'unbegun')
    local retries = tonumber(r[2] or '0') or 0
    if r[3] == '1' and v[I_STATUS] == STATUS_RUNNING then
      -- Claimed, its body never begun (begin.lua never cleared the mark): the same attempt
      -- goes back to the head of the queue for its first run (never failed unrun).
      to_queued(rec, id, MOVE_REQUEUE, v[I_STATUS], QUEUE, true, P .. 'queued')
      disown(id, v[I_REPLICA])
      v[I_REPLICA] = ''; v[I_STATUS] = STATUS_QUEUED
      moved = MOVED_QUEUED
    elseif r[1] and retries + 1 < (tonumber(r[1]) or 1) then
      -- A resumable execution whose owner died: its next attempt is queued.
      local attempt = tostring(tonumber(v[I_ATTEMPT]) + 1)
      to_queued(rec, id, MOVE_REQUEUE, v[I_STATUS], QUEUE, false, P .. 'queued',
        'attempt', attempt, 'retries', retries + 1)
      v[I_INPUT_REQUEST] = 'null'
      disown(id, v[I_REPLICA])
      v[I_REPLICA] = ''; v[I_ATTEMPT] = attempt; v[I_STATUS] = STATUS_QUEUED
      moved = MOVED_QUEUED
    else
      local err = cjson.encode({type = 'ExecutionLost',
        message = 'replica ' .. v[I_REPLICA] .. ' stopped renewing its liveness'})
      local fin = string.format('%.6f', NOW / 1000)
      move(rec, MOVE_LOSE, v[I_STATUS], STATUS_LOST, 'status_reason', '', 'error', err,
        'finished_at', fin, 'duration_seconds', '')
      v[I_INPUT_REQUEST] = 'null'
      v[I_STATUS] = STATUS_LOST; v[I_STATUS_REASON] = ''; v[I_ERROR] = err; v[I_FINISHED_AT] = fin; v[I_DURATION_SECONDS] = ''
      finish(rec, ev or (P .. 'ev:' .. id), id, v[I_SESSION_ID],
        P .. 'owned:' .. v[I_REPLICA])
      moved = MOVED_LOST
    end
  end
  v[I_MOVED] = moved
  return v
end
