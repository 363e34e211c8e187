--[[ retry
  KEYS[1..4]: the record (`x:{id}`), `running`, `owned:{owner}`, `scheduled`. ARGV[1..3]:
  the common arguments (header.lua).
  A failed attempt its RetryPolicy runs again, fenced like an end. ARGV[4..]: id, owner,
  attempt, the delay (ms), the `queued` channel. The next attempt (attempt + 1) is due after
  the delay on Redis's clock, in `scheduled` (claim.lua moves it to the queue once due);
  `scheduled_at` says when. Returns {1|0, the status found}.
]]
--! include header.lua
local id, owner, attempt, delay = ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
local rec = KEYS[1]
local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt')
if not v[1] then return {0, ''} end
if not OWNED[v[1]] or v[2] ~= owner or v[3] ~= attempt then
  -- Written already (the outbox writes again what it is not sure reached Redis).
  if v[1] == STATUS_QUEUED and v[3] == tostring(tonumber(attempt) + 1) then return {1, v[1]} end
  return {0, v[1]}
end
local due = NOW + delay
redis.call('HSET', rec, 'status', STATUS_QUEUED, 'attempt', tostring(tonumber(attempt) + 1),
  'replica', '', 'input_request', 'null', 'asking', '',
  'scheduled_at', string.format('%.6f', due / 1000))
redis.call('ZREM', KEYS[2], id)
redis.call('SREM', KEYS[3], id)
redis.call('ZADD', KEYS[4], due, id)
redis.call('PUBLISH', ARGV[8], id)
return {1, STATUS_RUNNING}
