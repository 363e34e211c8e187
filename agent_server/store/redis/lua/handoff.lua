--[[ handoff
  KEYS[1..4]: the record (`x:{id}`), `running`, `owned:{owner}`, `queue`. ARGV[1..3]: the
  common arguments (header.lua).
  Hand-off at shutdown, fenced like an end. ARGV[4..]: id, owner, attempt, the `queued`
  channel. The next attempt is queued for whichever replica takes it first. Returns
  {1|0, the status found}.
]]
--! include header.lua
local id, owner, attempt = ARGV[4], ARGV[5], ARGV[6]
local rec = KEYS[1]
local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt')
if not v[1] then return {0, ''} end
if not OWNED[v[1]] or v[2] ~= owner or v[3] ~= attempt then
  if v[1] == STATUS_QUEUED and v[3] == tostring(tonumber(attempt) + 1) then return {1, v[1]} end
  return {0, v[1]}
end
redis.call('HSET', rec, 'status', STATUS_QUEUED, 'attempt', tostring(tonumber(attempt) + 1),
  'replica', '', 'input_request', 'null', 'asking', '')
redis.call('ZREM', KEYS[2], id)
redis.call('SREM', KEYS[3], id)
redis.call('RPUSH', KEYS[4], id)
redis.call('PUBLISH', ARGV[7], id)
return {1, STATUS_RUNNING}
