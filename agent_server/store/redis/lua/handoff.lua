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
--! include header.lua
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
redis.call('HSET', rec, 'status', STATUS_QUEUED, 'attempt', tostring(tonumber(attempt) + 1),
  'replica', '', 'input_request', 'null', 'asking', '')
redis.call('ZREM', KEYS[2], id)
redis.call('SREM', KEYS[3], id)
if delay then
  local due = NOW + delay
  redis.call('HSET', rec, 'scheduled_at', string.format('%.6f', due / 1000))
  redis.call('ZADD', KEYS[5], due, id)
else
  redis.call('RPUSH', KEYS[4], id)
end
redis.call('PUBLISH', channel, id)
return {1, STATUS_RUNNING}
