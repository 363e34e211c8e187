--[[ handoff: the next attempt of a running execution, queued, fenced like an end: handed
  off at shutdown (due now), or a failure its RetryPolicy runs again (due after its delay).
  KEYS[1..5]: the record (`x:{id}`), `running`, `owned:{owner}`, `queue`, `scheduled`.
  ARGV[1..3]: the common arguments (header.lua).
  ARGV[4..]: id, owner, attempt, the `queued` channel, the delay (ms; '' for none).
  The record goes to `queued` with attempt + 1 for whichever replica takes it first: due
  now, at the tail of `queue`; after a delay, in `scheduled` scored by its due time on
  Redis's clock (claim.lua moves it to the queue once due), `scheduled_at` saying when.
  Returns {1|0, the status found}.
]]
--! include moves.lua
local id, owner, attempt, channel = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local delay = tonumber(ARGV[8])
local rec = KEYS[1]
local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt')
if not v[1] then return {0, ''} end
if not OWNED[v[1]] or v[2] ~= owner or v[3] ~= attempt then
  -- Written already (the outbox writes again what it is not sure reached Redis).
  if v[1] == STATUS_QUEUED and v[3] == tostring(tonumber(attempt) + 1) then return {1, v[1]} end
  return {0, v[1]}
end
redis.call('ZREM', KEYS[2], id)
redis.call('SREM', KEYS[3], id)
local next_attempt = tostring(tonumber(attempt) + 1)
if delay then  -- a retry, due later: claim.lua moves it to the queue then
  local due = NOW + delay
  redis.call('ZADD', KEYS[5], due, id)
  to_queued(rec, id, MOVE_RETRY, v[1], nil, false, channel, 'attempt', next_attempt,
    'scheduled_at', string.format('%.6f', due / 1000))
else
  to_queued(rec, id, MOVE_HAND_OFF, v[1], KEYS[4], false, channel, 'attempt', next_attempt)
end
return {1, STATUS_RUNNING}
