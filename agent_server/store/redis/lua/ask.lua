--[[ ask
  KEYS[1..7]: the record (`x:{id}`), the `ends` channel, `running`, `owned:{owner}`,
  `parked`, `webhooks`, `webhook_bodies` (webhooks.lua: its `execution.input_required`
  delivery). ARGV[1..3]: the common arguments (header.lua).
  Its reasoner waits for input (ctx.ask), fenced by owner and attempt like a checkpoint.
  ARGV[4..]: owner, attempt, request id (the number the attempt reached), the request (the
  record's `input_request`, JSON), '1' to park it ('0' to wait in its task), the request's
  timeout in ms ('' for none), its identity (asks.py), its label, and the last request of
  that identity this attempt matched out of order ('0' for none).
  Each request keeps `ident:{id}` and `label:{id}` until the execution ends (`asked_top`:
  the highest id asked). The numbered request asked another question (its identity
  differs): the first request after the last matched of this identity, and before the
  number, answers for it ({ASKED_ANSWERED, answer, id}, {ASKED_TIMED_OUT, '', id}, or
  {ASKED_AGAIN, '', id} when its answer was dropped: the caller asks it again under that
  id); none: {ASKED_MISMATCH, the numbered request's label, id}.
  Sets status input_required, input_request and `asking` (the pending request id), and
  publishes the id on `ends` (waiters that return at input_required re-read it).
  Parked (a resumable execution on the shared store): nobody owns it any more (`replica`
  '', out of `running` and its owner's set), `attempt` is the next one's, `parked_by`
  "{owner}|{attempt}" lets this attempt's events still owed be written, and `parked` holds
  it scored by when its request expires (Redis ms, +inf for never): the answer queues it,
  tick.lua queues it at that time, nothing ever judges it.
  A request an earlier attempt had answered (`answer:{request id}` kept: the reasoner asks
  again after a hand-off, a retry or a resume) is not asked again: its answer is returned,
  and nothing changes; one that expired while parked (`expired:{request id}`) times out.
  Returns {ASKED_RECORDED, status} waiting in its task; {ASKED_PARKED, status};
  {ASKED_ANSWERED, the kept answer (JSON), id}; {ASKED_TIMED_OUT, '', id}; {ASKED_FENCED,
  the status found ('' if unknown)} when this attempt no longer owns it.
]]
--! include moves.lua
--! include webhooks.lua
local rec = KEYS[1]
local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt', 'execution_id')
if not v[1] then return {ASKED_FENCED, ''} end
if v[1] ~= STATUS_RUNNING or v[2] ~= ARGV[4] or v[3] ~= ARGV[5] then return {ASKED_FENCED, v[1]} end
local n, identity = tonumber(ARGV[6]), ARGV[10]
local function kept_for(id)
  local kept = redis.call('HMGET', rec, 'answer:' .. id, 'expired:' .. id)
  if kept[1] then return {ASKED_ANSWERED, kept[1], id} end
  if kept[2] then return {ASKED_TIMED_OUT, '', id} end
  return nil
end
local identity_held = redis.call('HGET', rec, 'ident:' .. n)
if identity_held and identity_held ~= identity then
  for id = tonumber(ARGV[12]) + 1, n - 1 do
    if redis.call('HGET', rec, 'ident:' .. id) == identity then
      return kept_for(id) or {ASKED_AGAIN, '', id}
    end
  end
  return {ASKED_MISMATCH, redis.call('HGET', rec, 'label:' .. n) or '', n}
end
local kept = kept_for(n)
if kept then return kept end
local top = tonumber(redis.call('HGET', rec, 'asked_top') or '0')
-- Parked: in the move itself, so the record's history names the move a park.
local parking = ARGV[8] == '1'
local park = parking and {'replica', '', 'attempt', tostring(tonumber(v[3]) + 1),
  'parked_by', v[2] .. '|' .. v[3]} or {}
move(rec, MOVE_ASK, v[1], STATUS_INPUT_REQUIRED, 'input_request', ARGV[7], 'asking', ARGV[6], 'ident:' .. n, identity, 'label:' .. n, ARGV[11],
  'asked_top', tostring(math.max(top, n)), unpack(park))
local code = ASKED_RECORDED
if parking then
  redis.call('ZREM', KEYS[3], v[4])
  redis.call('SREM', KEYS[4], v[4])
  local expires = '+inf'
  if ARGV[9] ~= '' then expires = NOW + tonumber(ARGV[9]) end
  redis.call('ZADD', KEYS[5], expires, v[4])
  code = ASKED_PARKED
end
redis.call('PUBLISH', KEYS[2], v[4])
schedule_webhook(KEYS[6], KEYS[7], rec, v[4] .. '.input.' .. ARGV[5] .. '.' .. ARGV[6],
  'execution.input_required', v[3])
return {code, v[1]}
